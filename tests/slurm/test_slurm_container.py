"""Rendered container scripts executed with stub commands (srun, scontrol, apptainer record
what they get): the exact options per runtime, the host-side master, every hostile value of
every container field refused or delivered whole, and no canary ever runs (issue 18, item 2)."""

from __future__ import annotations

import os
import shlex
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

import clusterddp
from clusterddp.schedulers.slurm import render_sbatch
from clusterddp.schedulers.slurm_container import BATCH_TASK_VARIABLES, CLEARED_VARIABLES
from clusterddp.sections.container import ContainerSpec
from clusterddp.spec import JobSpec
from tests.conftest import cli, cli_env
from tests.hostile.test_renderers import CANARY, CORPUS, launcher_words, recorded, render_or_refuse
from tests.slurm.stubs import launcher_records

IMAGES = {"pyxis": "nvcr.io#nvidia/pytorch:24.05-py3", "apptainer": "/images/torch.sif", "oci": "/bundles/torch"}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """srun and apptainer record argv and env (NUL-separated), srun leaves the launchers' records;
    scontrol expands n[1-2]."""
    bin_dir = tmp_path_factory.mktemp("ctr-stubs")
    for name in ("srun", "apptainer"):
        (bin_dir / name).write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > "$STUB_OUT/{name}.argv"\n'
                                    f'env -0 > "$STUB_OUT/{name}.env"\n'
                                    + (launcher_records() if name == "srun" else ""))
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "n1\\nn2\\n"\n')
    (bin_dir / "squeue").write_text("#!/bin/sh\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir


def job_for(runtime: str, work: Path, **fields: object) -> JobSpec:
    container = ContainerSpec(image=IMAGES[runtime], runtime=runtime, workdir=str(work),  # type: ignore[arg-type]
                              launcher=str(work / "c.pyz"), env=("NCCL_DEBUG",),
                              mounts=() if runtime == "oci" else ("/datasets:/data:ro",))
    return JobSpec(name="c", script="t.py", nodes=2, env_passthrough=("SECRET",),
                   container=replace(container, **fields))


def run(script: str, stubs: Path, work: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    work.mkdir(parents=True, exist_ok=True)
    base = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_OUT": str(work), "SLURM_JOB_ID": "7", "HOME": str(work),
            "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    return subprocess.run(["bash", "-s"], input=script.encode(), cwd=work, env={**base, **env},
                          capture_output=True, timeout=600)


@pytest.mark.parametrize("runtime", sorted(IMAGES))
def test_step_options_and_host_side_master(runtime: str, stubs: Path, tmp_path: Path) -> None:
    """srun gets the runtime's exact options; MASTER_ADDR (scontrol, host side) is exported before
    the step, MASTER_PORT is not: each launcher derives it from SLURM_JOB_ID, handed in below."""
    (tmp_path / "c.pyz").write_text("")
    job_path = str(tmp_path / "job.yaml")
    result = run(render_sbatch(job_for(runtime, tmp_path), job_path), stubs, tmp_path)
    assert result.returncode == 0, result.stderr
    argv, env = recorded(tmp_path, "srun")
    assert env["MASTER_ADDR"] == "n1" and "MASTER_PORT" not in env and env["SLURM_JOB_ID"] == "7"
    tail = [*(["env", f"--chdir={tmp_path}"] if runtime == "oci" else ["env"]),
            *[w for n in CLEARED_VARIABLES for w in ("-u", n)],
            *[w for n in (BATCH_TASK_VARIABLES if runtime == "oci" else ()) for w in ("-u", n)], "python3", str(tmp_path / "c.pyz"), "run", job_path,
            "--restart-count", "0", "--marks-dir", f"{tmp_path}/logs/7/launchers/0.0"]
    assert argv[-len(tail):] == tail  # a relative logs.dir starts at the container's workdir
    mounts = f"/datasets:/data:ro,{tmp_path}:{tmp_path}"
    if runtime == "pyxis":
        assert argv[4:9] == [f"--container-image={IMAGES[runtime]}", f"--container-mounts={mounts}",
                             f"--container-workdir={tmp_path}", "--no-container-mount-home", argv[8]]
        names = argv[8].removeprefix("--container-env=").split(",")
        assert {"MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "SLURM_NODEID", "SLURM_STEP_NODELIST", "CUDA_VISIBLE_DEVICES",
                "NCCL_DEBUG", "SECRET", "SLURM_RESTART_COUNT"} <= set(names)
    elif runtime == "oci":
        assert argv[4] == f"--container={IMAGES[runtime]}"
    else:
        assert argv[4] == "/bin/bash" and argv[argv.index("--") + 1:argv.index("--") + 9] == [
            "apptainer", "exec", "--nv", "--cleanenv", "--no-home", f"--pwd={tmp_path}", f"--bind={mounts}",
            IMAGES[runtime]]


def test_apptainer_shim_hands_exactly_the_named_variables_in(stubs: Path, tmp_path: Path) -> None:
    """On a node, the host-side shim turns each named variable into APPTAINERENV_NAME with its
    exact value (commas, quotes, a newline), skips unset ones, and passes nothing else by that route."""
    job_path = str(tmp_path / "job.yaml")
    words = launcher_words(render_sbatch(job_for("apptainer", tmp_path), job_path))
    hostile = "a,b='c'\n$(touch pwned)"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_OUT": str(tmp_path), "SLURM_NODEID": "1",
           "NCCL_DEBUG": hostile, "UNNAMED": "x"}
    result = subprocess.run(words, env=env, cwd=tmp_path, capture_output=True)
    assert result.returncode == 0, result.stderr
    argv, got = recorded(tmp_path, "apptainer")
    handed = {k.removeprefix("APPTAINERENV_"): v for k, v in got.items() if k.startswith("APPTAINERENV_")}
    assert handed == {"SLURM_NODEID": "1", "NCCL_DEBUG": hostile}
    assert argv[:4] == ["exec", "--nv", "--cleanenv", "--no-home"] and not (tmp_path / CANARY).exists()


def test_missing_launcher_stops_before_srun(stubs: Path, tmp_path: Path) -> None:
    """Without the zipapp the script exits 2 naming 'clusterddp pack -o PATH' and starts no step."""
    result = run(render_sbatch(job_for("pyxis", tmp_path), str(tmp_path / "job.yaml")), stubs, tmp_path)
    assert result.returncode == 2
    assert f"clusterddp pack -o {tmp_path / 'c.pyz'}" in result.stderr.decode()
    assert not (tmp_path / "srun.argv").exists()


FIELDS = {
    "image": lambda v: {"image": v},
    "mounts": lambda v: {"mounts": (v,)},
    "mounts host": lambda v: {"mounts": (f"/h{v}:/c",)},
    "workdir": lambda v: {"workdir": v},
    "env": lambda v: {"env": (v,)},
    "launcher": lambda v: {"launcher": v},
}


@pytest.mark.parametrize("runtime", sorted(IMAGES))
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_every_hostile_value_of_every_container_field(field: str, runtime: str, stubs: Path, tmp_path: Path) -> None:
    """Each corpus value is refused in one line, or the script runs with stubs, srun starts, and
    no canary command runs."""
    for index, value in enumerate(CORPUS):
        work = tmp_path / str(index)
        job = job_for(runtime, work, **FIELDS[field](value))
        if field == "mounts" and runtime == "oci":
            job = replace(job, container=replace(job.container, mounts=(value,)))
        script = render_or_refuse(lambda: render_sbatch(job, str(tmp_path / "job.yaml")))
        if script is None:
            continue
        work.mkdir(parents=True, exist_ok=True)
        pyz = Path(job.container.launcher or "")
        if pyz.parent.is_dir() and not pyz.exists():
            pyz.write_text("")
        result = run(script, stubs, work)
        assert not (work / CANARY).exists(), (field, value)
        if pyz.exists():
            assert result.returncode == 0, (field, value, result.stderr)
            argv, _ = recorded(work, "srun")
            if runtime == "pyxis" and field == "image":
                assert f"--container-image={value}" in argv


def test_the_hint_of_a_container_script_names_the_pack_step_it_needs(stubs: Path, tmp_path: Path) -> None:
    """Line 3's hand-run commands name 'clusterddp pack -o PYZ': the script exits 2 before that step
    and starts srun after it, run exactly as written."""
    script = render_sbatch(job_for("pyxis", tmp_path), str(tmp_path / "job.yaml"))
    by_hand = script.splitlines()[2].split("(or: ", 1)[1].removesuffix(")").split(" && ")
    assert by_hand == ["mkdir -p logs", f"clusterddp pack -o {tmp_path / 'c.pyz'}", "sbatch THIS_FILE"]
    assert run(script, stubs, tmp_path).returncode == 2
    assert cli(*shlex.split(by_hand[1])[1:], cwd=tmp_path).returncode == 0
    result = run(script, stubs, tmp_path)
    assert result.returncode == 0, result.stderr
    assert recorded(tmp_path, "srun")[0][-4:-1] == ["--restart-count", "0", "--marks-dir"]


def test_render_o_and_submit_of_a_container_job_take_care_of_the_pack(tmp_path: Path) -> None:
    """'render -o' says to run 'clusterddp pack -o PYZ' before sbatch; 'submit' builds PYZ itself."""
    (tmp_path / "t.py").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text("name: c\nscript: t.py\nnodes: 2\ncontainer: {image: /images/torch.sqsh}\n")
    pyz = tmp_path / ".clusterddp" / f"clusterddp-{clusterddp.__version__}.pyz"
    result = cli("render", "slurm", str(job), "-o", str(tmp_path / "c.sbatch"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"submit it with: mkdir -p logs && clusterddp pack -o {pyz} && sbatch {tmp_path / 'c.sbatch'}" in result.stdout
    assert not pyz.exists()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 42\n")
    (fake / "sbatch").chmod(0o755)
    result = cli("submit", "slurm", str(job), cwd=tmp_path, env=cli_env(PATH=f"{fake}:{os.environ['PATH']}"))
    assert result.returncode == 0 and result.stdout == "42\n", result.stderr
    assert f"clusterddp: wrote the launcher the container runs: {pyz}" in result.stderr
    assert zipfile.is_zipfile(pyz)


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_an_absolute_log_dir_is_mounted_where_the_launcher_records(runtime: str, stubs: Path, tmp_path: Path) -> None:
    """logs.dir outside the working directory is mounted at its own path (rank logs, launcher marks);
    the records of attempt 0 go under it."""
    work, logs = tmp_path / "work", tmp_path / "logs"
    work.mkdir()
    (work / "c.pyz").write_text("")
    job = replace(job_for(runtime, work), logs=replace(JobSpec(name="c", script="t.py").logs, dir=str(logs)))
    result = run(render_sbatch(job, str(work / "job.yaml")), stubs, work)
    assert result.returncode == 0, result.stderr
    argv, _ = recorded(work, "srun")
    mounts = next(w for w in argv if w.startswith(("--container-mounts=", "--bind=")))
    assert f"{logs}:{logs}" in mounts.split("=", 1)[1].split(",")
    assert argv[-2:] == ["--marks-dir", f"{logs}/7/launchers/0.0"]
