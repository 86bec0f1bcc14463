"""Renderers under hostile values: the rendered sbatch script and OpenPAI job are executed with
stub ``srun``/``scontrol``/``sbatch``/``clusterddp`` on PATH, for an adversarial corpus in every
field that reaches a renderer. JobSpecs are built directly, so nothing the job-file loader
refuses protects the renderer: it must be safe on its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp.errors import JobSpecError
from clusterddp.schedulers.openpai.render import render_openpai
from clusterddp.schedulers.slurm import default_output, render_sbatch
from clusterddp.sections.container import ContainerSpec
from clusterddp.sections.openpai import OpenPAISpec
from clusterddp.sections.slurm import SlurmSpec
from clusterddp.spec import JobSpec, LogsSpec
from clusterddp.validate import is_control
from tests.hostile.sbatch_parse import directive_arguments, directive_lines_after_commands
from tests.slurm.stubs import launcher_records

CANARY = "pwned"
CORPUS = [
    "a\nb", f"x\ntouch {CANARY} #", f"x\rtouch {CANARY}", f"x\r\ntouch {CANARY}", f"$(touch {CANARY})",
    f"`touch {CANARY}`", f"'; touch {CANARY}; '", f'"; touch {CANARY}; "', f"a;touch {CANARY}",
    f"a && touch {CANARY}", f"a | touch {CANARY}", f"a # touch {CANARY}", "#SBATCH --wrap=x",
    f"a\u2028touch {CANARY}", f"a\u2029touch {CANARY}", f"a\u0085touch {CANARY}", f"a\x00touch {CANARY}",
    f"a\x0btouch {CANARY}", f"a\x0ctouch {CANARY}", f"a\ttouch {CANARY}", "-x", "--export=ALL", "%j",
    "%x-%A.out", "a b c", "\\", "a\\", "'", '"', "\x1b[2J\x1b]0;title\x07", f"${{IFS}}touch${{IFS}}{CANARY}",
    "$HOME", "!!", "*", "~root", "hetjob", " hetjob --x", "x" * 70000, "é ü 中文", "\ufeffx", "a\u202etxt",
    ":x", "<% $secrets.token %>", "a'b\"c\\d#e", "", " ", "--job-name=evil", f"\"\n#SBATCH --wrap='touch {CANARY}'",
]
JOB_PATH = "/shared/jobs/job.yaml"
PYTHON = "/opt/venv/bin/python"
#: What srun gets before the launcher's command, for the 2-node base job.
SRUN_OPTIONS = ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]


def base_job(**changes: object) -> JobSpec:
    job = JobSpec(name="j", script="t.py", nodes=2, logs=LogsSpec(dir="logs"))
    return replace(job, **changes)


def slurm_with(**fields: object) -> JobSpec:
    return base_job(slurm=replace(SlurmSpec(), **fields))


#: field -> (job, job path, python) with the hostile value in that field.
SLURM_FIELDS: dict[str, Callable[[str], tuple[JobSpec, str, str]]] = {
    "name": lambda v: (base_job(name=v), JOB_PATH, PYTHON),
    "logs.dir": lambda v: (base_job(logs=LogsSpec(dir=v)), JOB_PATH, PYTHON),
    "job path": lambda v: (base_job(), v, PYTHON),
    "python flag": lambda v: (base_job(), JOB_PATH, v),
    "job python": lambda v: (base_job(python=v), JOB_PATH, ""),
    "env key": lambda v: (base_job(env={v: "1"}), JOB_PATH, PYTHON),
    "env value": lambda v: (base_job(env={"HOSTILE": v}), JOB_PATH, PYTHON),
    "env_passthrough": lambda v: (base_job(env_passthrough=(v,)), JOB_PATH, PYTHON),
    "nodes": lambda v: (base_job(nodes=v), JOB_PATH, PYTHON),
    "restarts": lambda v: (base_job(restarts=v), JOB_PATH, PYTHON),
    "slurm.cpus_per_task": lambda v: (slurm_with(cpus_per_task=v), JOB_PATH, PYTHON),
    "slurm.gpus_per_node": lambda v: (slurm_with(gpus_per_node=v), JOB_PATH, PYTHON),
    **{f"slurm.{f}": (lambda f: lambda v: (slurm_with(**{f: v}), JOB_PATH, PYTHON))(f)
       for f in ("partition", "account", "qos", "constraint", "mem", "time", "signal", "output", "error")},
    "slurm.extra_sbatch": lambda v: (slurm_with(extra_sbatch=(v,)), JOB_PATH, PYTHON),
    "slurm.extra_sbatch value": lambda v: (slurm_with(extra_sbatch=("--comment=" + v,)), JOB_PATH, PYTHON),
    "slurm.setup": lambda v: (slurm_with(setup=(v,)), JOB_PATH, PYTHON),
    "args (never rendered)": lambda v: (base_job(args=(v,)), JOB_PATH, PYTHON),
}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bin dir whose srun/scontrol/sbatch/clusterddp record argv (NUL-separated) and env; srun
    also leaves the records each node's launcher would."""
    bin_dir = tmp_path_factory.mktemp("stubs")
    for name in ("srun", "scontrol", "sbatch", "clusterddp"):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > "$STUB_OUT/{name}.argv"\nenv -0 > "$STUB_OUT/{name}.env"\n'
                        + (launcher_records() if name == "srun" else ""))
        stub.chmod(0o755)
    return bin_dir


def run_script(script: str, stubs: Path, work: Path, *, shell_line: bool = False) -> subprocess.CompletedProcess[bytes]:
    """Run a rendered script (or one shell line) with bash in ``work``, the stubs first on PATH."""
    work.mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_OUT": str(work), "SLURM_JOB_ID": "7", "HOME": str(work),
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    argv = ["bash", "-c", script] if shell_line else ["bash", "-s"]
    return subprocess.run(argv, input=None if shell_line else script.encode(), cwd=work, env=env,
                          capture_output=True, timeout=600)


def marks_dir(job: JobSpec, work: Path) -> str:
    """The ``--marks-dir`` of attempt 0 of job 7 run in ``work``: ``logs.dir`` as bare launchers see it."""
    logs = job.logs.dir if os.path.isabs(job.logs.dir) else f"{work}/{job.logs.dir}"
    return f"{logs}/7/launchers/0.0"


def recorded(work: Path, name: str) -> tuple[list[str], dict[str, str]]:
    argv = (work / f"{name}.argv").read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
    env_items = (work / f"{name}.env").read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
    return argv, dict(item.split("=", 1) for item in env_items)


def launcher_words(script: str) -> list[str]:
    """The words of the script's ``launcher=(...)`` line as bash reads them."""
    line = next(line for line in script.split("\n") if line.startswith("launcher=("))
    words = subprocess.run(["bash", "-c", line + '\nprintf "%s\\0" "${launcher[@]}"'],
                           capture_output=True, check=True).stdout.decode("utf-8", "surrogateescape")
    return words.split("\0")[:-1]


def assert_one_line_refusal(exc: JobSpecError) -> None:
    text = str(exc)
    assert "\n" not in text and not any(is_control(c) for c in text), repr(text)
    assert len(text) < 600, len(text)


def render_or_refuse(make: Callable[[], str]) -> str | None:
    try:
        return make()
    except JobSpecError as exc:
        assert_one_line_refusal(exc)
        return None


def check_structure(script: str) -> list[str]:
    """sbatch reads every #SBATCH line (all before the first command) and no NUL or CR LF."""
    assert "\0" not in script and "\r\n" not in script
    assert directive_lines_after_commands(script) == []
    args = directive_arguments(script)
    assert len(args) == sum(1 for line in script.split("\n") if line.startswith("#SBATCH")) + sum(
        1 for line in script.split("\n") if line.startswith("#SBATCH -") and line[9:10] != "-" and " " in line[10:])
    assert "--requeue" in args and any(a.startswith("--signal=") for a in args)
    return args


@pytest.mark.parametrize("field", sorted(SLURM_FIELDS))
def test_sbatch_for_every_hostile_value(field: str, stubs: Path, tmp_path: Path) -> None:
    """Every corpus string in this field is refused in one line, or the script, run by bash,
    creates no canary, gives srun exactly the planned argv, and keeps every #SBATCH line read."""
    rendered = 0
    for index, value in enumerate(CORPUS):
        job, job_path, python = SLURM_FIELDS[field](value)
        script = render_or_refuse(lambda: render_sbatch(job, job_path, python=python or None))
        if script is None:
            continue
        rendered += 1
        args = check_structure(script)
        work = tmp_path / str(index)
        result = run_script(script, stubs, work)
        if field == "logs.dir" and b"where the launchers record that they started: stopping" in result.stderr:
            assert result.returncode == 1 and not (work / "srun.argv").exists()  # e.g. a name too long
            continue
        if field != "slurm.setup":
            assert not (work / CANARY).exists(), (field, value)
            assert result.returncode == 0, result.stderr
        argv, env = recorded(work, "srun")
        interpreter = python or job.python or sys.executable
        assert argv == [*SRUN_OPTIONS, interpreter, "-m", "clusterddp", "run", job_path, "--restart-count", "0",
                        "--marks-dir", marks_dir(job, work)], (field, value)
        if field == "env value":
            assert env["HOSTILE"] == value
        if field == "name":
            assert f"--job-name={value}" in args
        if field in ("slurm.output", "slurm.extra_sbatch value"):
            expected = (f"--output={default_output(job)}" if field == "slurm.output"
                        else "--comment=" + value.strip(" \t"))
            assert expected in args
        if field == "args (never rendered)" and len(value) > 3:
            assert value not in script
    assert rendered or field not in ("env value", "slurm.output", "slurm.setup", "args (never rendered)")


def test_corpus_is_large_enough() -> None:
    """The adversarial corpus has at least 30 distinct strings."""
    assert len(set(CORPUS)) >= 30


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch is not installed")
def test_real_sbatch_reads_the_directives_as_the_port_does(tmp_path: Path) -> None:
    """The installed sbatch (parsing only, no controller) takes exactly the arguments the port
    of its parser predicts, for every hostile value that renders into a directive."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nSlurmctldPort=9\nMessageTimeout=1\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=localhost Default=YES\n")
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(conf), "HOME": str(tmp_path)}
    checked = 0
    for field in ("name", "slurm.output", "slurm.error", "slurm.extra_sbatch value", "slurm.extra_sbatch", "logs.dir"):
        for value in CORPUS[:48]:
            job, job_path, python = SLURM_FIELDS[field](value)
            script = render_or_refuse(lambda: render_sbatch(job, job_path, python=python))
            if script is None:
                continue
            path = tmp_path / "job.sbatch"
            path.write_text(script, encoding="utf-8")
            result = subprocess.run(["sbatch", "-vvv", str(path)], env=env, capture_output=True, timeout=600)
            marker = b'Found in script, argument "'
            found = [line.split(marker, 1)[1][:-1].decode("utf-8", "surrogateescape")
                     for line in result.stderr.split(b"\n") if marker in line]
            assert found == directive_arguments(script), (field, value, result.stderr[-500:])
            checked += 1
    assert checked >= 30


@pytest.mark.parametrize("field,value", [
    ("name", "x\n#SBATCH --wrap=y"), ("logs.dir", "logs\ntouch /tmp/x #"), ("slurm.setup", "a\u2028b"),
    ("slurm.output", "o\rx"), ("env value", "a\x00b"), ("job path", "/a\x85b.yaml"),
])
def test_refusals_name_the_key(field: str, value: str) -> None:
    """A value that cannot be written exactly is refused with one line naming its key."""
    job, job_path, python = SLURM_FIELDS[field](value)
    with pytest.raises(JobSpecError) as info:
        render_sbatch(job, job_path, python=python)
    assert_one_line_refusal(info.value)
    key = {"env value": "env.HOSTILE", "slurm.setup": "slurm.setup[0]", "job path": "job file path"}.get(field, field)
    assert f": {key}: " in str(info.value)


#: Values near the valid ones for ``nodes`` (an int or "MIN:MAX") and ``restarts`` (an int).
NODES_VALUES: list[object] = [
    "1:2", "2:2", "1:65536", "0:2", "2:1", "1:65537", "1-2", "1:2 ", " 1:2", "1:2\n", "1:2\n#SBATCH --wrap=x",
    f"1:2;touch {CANARY}", f"1:$(touch {CANARY})", "\uff11:\uff12", "\u0661:\u0662", "1:2:3", ":2", "1:", "1_0:20",
    "+1:2", "-1:2", "1:99999999999", 0, -1, True, 2.0, 65537, 1 << 70, None, [1, 2],
]
RESTARTS_VALUES: list[object] = [0, 1, 7, 1 << 20, (1 << 20) + 1, 1 << 63, 1 << 70, -1, True, 1.0, "1", "1; touch x",
                                 None, float("nan")]


@pytest.mark.parametrize("field,value", [("nodes", v) for v in NODES_VALUES] + [("restarts", v) for v in RESTARTS_VALUES])
def test_node_ranges_and_restarts(field: str, value: object, stubs: Path, tmp_path: Path) -> None:
    """A hostile nodes/restarts value is refused in one line naming the key, or renders exactly:
    '--nodes=MIN[-MAX]', min_nodes and max_restarts as plain digits, and the script runs srun
    with the planned argv and creates no canary."""
    job = base_job(**{field: value})
    try:
        script = render_sbatch(job, JOB_PATH, python=PYTHON)
    except JobSpecError as exc:
        assert_one_line_refusal(exc)
        assert f": {field}: " in str(exc)
        return
    args = check_structure(script)
    lines = script.split("\n")
    if field == "nodes":
        low, high = (value, value) if isinstance(value, int) else map(int, str(value).split(":"))
        assert (f"--nodes={low}" if low == high else f"--nodes={low}-{high}") in args
        assert f"min_nodes={low}" in lines
    else:
        assert f"max_restarts={value}" in lines
        assert ("--no-kill" in args) == (value != 0)
    result = run_script(script, stubs, tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / CANARY).exists()
    assert recorded(tmp_path, "srun")[0] == [*SRUN_OPTIONS, PYTHON, "-m", "clusterddp", "run", JOB_PATH,
                                             "--restart-count", "0", "--marks-dir", marks_dir(job, tmp_path)]


def test_passthrough_goes_to_sbatch_by_name_only() -> None:
    """env_passthrough becomes '#SBATCH --export=ALL,NAMES'; an extra --export is refused."""
    script = render_sbatch(base_job(env_passthrough=("WANDB_API_KEY", "HF_TOKEN")), JOB_PATH, python=PYTHON)
    assert "--export=ALL,WANDB_API_KEY,HF_TOKEN" in directive_arguments(script)
    assert "export WANDB_API_KEY" not in script
    with pytest.raises(JobSpecError, match=r"slurm.extra_sbatch\[0\]"):
        render_sbatch(replace(slurm_with(extra_sbatch=("--export=NONE",)), env_passthrough=("A",)), JOB_PATH)
    with pytest.raises(JobSpecError, match="env.A"):
        render_sbatch(base_job(env={"A": "v"}, env_passthrough=("A",)), JOB_PATH)


def test_a_broken_setup_line_cannot_swallow_the_rest(stubs: Path, tmp_path: Path) -> None:
    """An unclosed quote, a trailing backslash or a here-document in one setup line fails on its
    own: srun still gets its exact argv."""
    job = slurm_with(setup=("echo 'unclosed", "echo trailing \\", "cat <<EOF", "echo ok > ok.txt"))
    work = tmp_path / "w"
    run_script(render_sbatch(job, JOB_PATH, python=PYTHON), stubs, work)
    assert (work / "ok.txt").read_text() == "ok\n"
    assert recorded(work, "srun")[0][-9:-2] == [PYTHON, "-m", "clusterddp", "run", JOB_PATH, "--restart-count", "0"]


# --- OpenPAI -------------------------------------------------------------------------------

def pai_job(**fields: object) -> JobSpec:
    return base_job(container=ContainerSpec(image="img:1"), openpai=replace(OpenPAISpec(), **fields))


OPENPAI_FIELDS: dict[str, Callable[[str], tuple[JobSpec, str, str | None]]] = {
    "name": lambda v: (base_job(name=v, container=ContainerSpec(image="img:1")), JOB_PATH, None),
    "--name": lambda v: (pai_job(), JOB_PATH, v),
    "job path": lambda v: (pai_job(), v, None),
    **{f"openpai.{f}": (lambda f: lambda v: (pai_job(**{f: v}), JOB_PATH, None))(f)
       for f in ("name", "virtual_cluster", "task_role", "port_label", "cpu", "memory_mb", "gpu",
                 "shm_mb")},
    "container.image": lambda v: (base_job(container=ContainerSpec(image=v)), JOB_PATH, None),
    "openpai.parameters key": lambda v: (pai_job(parameters={v: "1"}), JOB_PATH, None),
    "openpai.parameters value": lambda v: (pai_job(parameters={"p": v}), JOB_PATH, None),
    "openpai.setup": lambda v: (pai_job(setup=(v,)), JOB_PATH, None),
    "nodes": lambda v: (base_job(nodes=v, container=ContainerSpec(image="img:1")), JOB_PATH, None),
    "restarts": lambda v: (base_job(restarts=v, container=ContainerSpec(image="img:1")), JOB_PATH, None),
}


@pytest.mark.parametrize("field", sorted(OPENPAI_FIELDS))
def test_openpai_for_every_hostile_value(field: str, stubs: Path, tmp_path: Path) -> None:
    """Every corpus string here is refused in one line, or the spec reads back exactly and its
    commands, joined with ' && ' as the REST server does, give clusterddp exactly ['run', path]."""
    for index, value in enumerate(CORPUS):
        job, job_path, name = OPENPAI_FIELDS[field](value)
        text = render_or_refuse(lambda: render_openpai(job, job_path, name=name))
        if text is None:
            continue
        spec = yaml.safe_load(text)
        role = spec["taskRoles"][job.openpai.task_role]
        commands = role["commands"]
        assert commands[:-1] == list(job.openpai.setup)
        if field in ("container.image", "openpai.virtual_cluster", "openpai.parameters value"):
            got = {"container.image": spec["prerequisites"][0]["uri"], "openpai.virtual_cluster":
                   spec["defaults"]["virtualCluster"], "openpai.parameters value": spec["parameters"].get("p")}
            assert got[field] == value
        if field == "openpai.parameters key":
            assert spec["parameters"] == {value: "1"}
        if field == "openpai.setup":
            continue  # shell by design; '&&' stops at a failing line, as OpenPAI itself does
        work = tmp_path / str(index)
        result = run_script(" && ".join(commands), stubs, work, shell_line=True)
        assert result.returncode == 0, (field, value, result.stderr)
        assert not (work / CANARY).exists(), (field, value)
        assert recorded(work, "clusterddp")[0] == ["run", job_path]


@pytest.mark.parametrize("value", [
    -1, -2, 1 << 31, 1 << 63, 10 ** 100, float("nan"), float("inf"), 1.0, "1", "", "0x10", True, None,
])
def test_openpai_restarts_out_of_range_or_not_an_integer(value: object) -> None:
    """restarts becomes jobRetryCount, an int32 >= 0 in FrameworkController: a negative (-2 is its
    'retry forever'), huge, fractional, string or bool value is refused in one line naming it."""
    job = base_job(restarts=value, container=ContainerSpec(image="img:1"))
    with pytest.raises(JobSpecError) as info:
        render_openpai(job, JOB_PATH)
    assert_one_line_refusal(info.value)
    assert str(info.value).startswith(f"{JOB_PATH}: restarts: must be an integer from 0 to 2147483647")


# --- properties ----------------------------------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(field=st.sampled_from(["name", "logs.dir", "job path", "python flag", "env value", "slurm.output",
                              "slurm.error", "slurm.partition", "slurm.extra_sbatch value", "slurm.setup",
                              "env key", "env_passthrough"]), value=TEXT)
def test_sbatch_property(field: str, value: str) -> None:
    """For any text in any field: a one-line refusal, or every directive read and the srun
    line splitting back into exactly the planned words."""
    job, job_path, python = SLURM_FIELDS[field](value)
    script = render_or_refuse(lambda: render_sbatch(job, job_path, python=python))
    if script is None:
        return
    args = check_structure(script)
    assert launcher_words(script) == [python or sys.executable, "-m", "clusterddp", "run", job_path]
    if field == "name":
        assert f"--job-name={value}" in args
    if field in ("slurm.output", "slurm.error") and value:
        assert f"--{field[6:]}={value}" in args
    if field == "env value":
        assert any(line.startswith("export HOSTILE=") for line in script.split("\n"))


@SLOW
@given(field=st.sampled_from(["name", "--name", "job path", "container.image", "openpai.virtual_cluster",
                              "openpai.parameters key", "openpai.parameters value", "openpai.task_role",
                              "openpai.setup"]), value=TEXT)
def test_openpai_property(field: str, value: str) -> None:
    """For any text in any field: a one-line refusal, or a spec whose values read back exactly
    and whose last command is 'clusterddp run <path>' as one shell word."""
    import shlex

    job, job_path, name = OPENPAI_FIELDS[field](value)
    text = render_or_refuse(lambda: render_openpai(job, job_path, name=name))
    if text is None:
        return
    spec = yaml.safe_load(text)
    commands = spec["taskRoles"][job.openpai.task_role]["commands"]
    assert shlex.split(commands[-1]) == ["clusterddp", "run", job_path]
    assert spec["prerequisites"][0]["uri"] == job.container.image
    assert spec["defaults"]["virtualCluster"] == job.openpai.virtual_cluster
    assert spec["parameters"] == dict(job.openpai.parameters)
    assert json.dumps(spec)  # plain data only: no YAML tags smuggled in
