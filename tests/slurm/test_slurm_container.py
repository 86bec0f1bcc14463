"""Rendered container scripts executed with stub commands (srun, scontrol, apptainer record
what they get): the exact options per runtime, the host-side master, every hostile value of
every container field refused or delivered whole, and no canary ever runs (issue 18, item 2)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from clusterddp.schedulers.slurm import render_sbatch
from clusterddp.schedulers.slurm_container import BATCH_TASK_VARIABLES, CLEARED_VARIABLES
from clusterddp.sections.container import ContainerSpec
from clusterddp.spec import JobSpec
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
                          capture_output=True, timeout=20)


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
            "--restart-count", "0", "--record-dir", f"{tmp_path}/logs/7/launchers/0.0"]
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
