"""Rendering a job file as an OpenPAI protocol-v2 job: golden files, values, refusals."""

from __future__ import annotations

import difflib
import os
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from server_rules import server_errors

from clusterddp import __version__
from clusterddp.errors import JobSpecError
from clusterddp.schedulers.openpai.scheduler import OpenPAIOptions, OpenPAIScheduler
from clusterddp.schedulers.openpai.render import chain_problem, render_openpai
from clusterddp.schedulers.quoting import yaml_scalar
from clusterddp.sections.container import ContainerSpec
from clusterddp.sections.openpai import OpenPAISpec
from clusterddp.spec import load_job

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GOLDEN = HERE / "golden"
REGENERATE = "CLUSTERDDP_REGEN_GOLDEN"


def render_fixture(name: str) -> str:
    path = HERE / "jobs" / f"{name}.yaml"
    text = render_openpai(load_job(path), os.path.relpath(path, REPO))
    return text.replace(f"clusterddp {__version__} ", "clusterddp VERSION ")


@pytest.mark.parametrize("name", ["minimal", "full"])
def test_golden_file(name: str) -> None:
    """The rendered spec is byte-for-byte the reviewed golden file."""
    got = render_fixture(name)
    golden = GOLDEN / f"{name}.openpai.yaml"
    if os.environ.get(REGENERATE):
        golden.write_text(got, encoding="utf-8")
    want = golden.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(golden), "rendered"))
        pytest.fail(f"{golden.name} differs from the rendered spec:\n{diff}\n"
                    f"if the change is intended: {REGENERATE}=1 pytest {Path(__file__).name}, then review the diff")


def test_full_job_values_read_back_exactly() -> None:
    """Every value of the full fixture parses back to what the job file said."""
    job = load_job(HERE / "jobs" / "full.yaml")
    spec = yaml.safe_load(render_openpai(job, "jobs/full.yaml"))
    assert spec["name"] == "resnet_v2-ddp" and spec["protocolVersion"] == 2 and spec["type"] == "job"
    assert spec["prerequisites"] == [{"type": "dockerimage", "name": "image",
                                      "uri": "registry.example:5000/team/torch:2.4"}]
    role = spec["taskRoles"]["train_er"]
    assert role["instances"] == 4 and role["dockerImage"] == "image"
    assert role["resourcePerInstance"] == {"cpu": 32, "memoryMB": 131072, "gpu": 4, "ports": {"RdzvPort": 1}}
    assert role["extraContainerOptions"] == {"shmMB": 16384}
    assert role["completion"] == {"minFailedInstances": 1, "minSucceededInstances": 4}
    assert (role["taskRetryCount"], spec["jobRetryCount"]) == (0, 2)
    assert role["commands"] == [*job.openpai.setup, "clusterddp run jobs/full.yaml"]
    assert spec["parameters"] == {"data": "/mnt/data/imagenet", "epochs": "3", "yes": "no"}
    assert spec["defaults"] == {"virtualCluster": "gpu_a100"}
    assert spec["extras"] == {"gangAllocation": True}


@pytest.mark.parametrize("restarts", [0, 1, 7])
def test_restarts_render_as_the_job_retry_count_and_no_task_retries(restarts: int) -> None:
    """restarts: N is jobRetryCount: N (whole-job retries); taskRetryCount stays 0 whatever N is."""
    job = replace(load_job(HERE / "jobs" / "minimal.yaml"), restarts=restarts)
    spec = yaml.safe_load(render_openpai(job, "minimal.yaml"))
    assert spec["jobRetryCount"] == restarts
    assert spec["taskRoles"]["worker"]["taskRetryCount"] == 0
    assert spec["taskRoles"]["worker"]["commands"] == ["clusterddp run minimal.yaml"]


def write_job(tmp_path: Path, extra: str) -> Path:
    (tmp_path / "t.py").write_text("", encoding="utf-8")
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\nscript: t.py\ncontainer:\n  image: img:1\n{extra}", encoding="utf-8")
    return path


def test_fixed_range_renders_its_count_and_a_real_range_is_refused_at_its_line(tmp_path: Path) -> None:
    """nodes '4:4' is 4 instances; '3:4' is refused naming file:line: nodes, with a hint."""
    fixed = load_job(write_job(tmp_path, "nodes: '4:4'\n"))
    assert yaml.safe_load(render_openpai(fixed, "job.yaml"))["taskRoles"]["worker"]["instances"] == 4
    elastic = load_job(write_job(tmp_path, "nodes: '3:4'\n"))
    with pytest.raises(JobSpecError) as info:
        render_openpai(elastic, "job.yaml")
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'job.yaml'}:5: nodes: '3:4': OpenPAI runs a fixed number of instances")
    assert "hint: write nodes: 4" in text and "\n" not in text


@pytest.mark.parametrize("line, message", [
    ("restarts: 2147483648", "must be an integer from 0 to 2147483647, got 2147483648"),
    ("restarts: 99999999999999", "must be an integer from 0 to 2147483647"),
    ("restarts: -1", "must be >= 0, got -1"),
    ("restarts: many", "expected an integer, got"),
    ("restarts: 1.5", "expected an integer, got"),
    ("restarts: [1]", "expected an integer, got"),
    ("nodes: '3:4'", "OpenPAI runs a fixed number of instances"),
    ("nodes: 10001", "at most 10000 per task role"),
    ("openpai:\n  job_retry_count: 2", "unknown key (hint: write the job's top-level 'restarts: N'"),
])
def test_render_command_refuses_bad_retries_in_one_line_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str) -> None:
    """'clusterddp render openpai JOB' with a bad restarts/nodes: exit 2, one stderr line 'file:line: key: ...'."""
    from clusterddp.cli import main

    path = write_job(tmp_path, line + "\n")
    if line.startswith("openpai:"):
        path.write_text(f"name: j\nscript: t.py\n{line}\n", encoding="utf-8")
    assert main(["render", "openpai", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.rstrip("\n")
    key = "openpai.job_retry_count" if line.startswith("openpai:") else line.split(":")[0]
    row = 4 if line.startswith("openpai:") else 5
    assert "\n" not in err and err.startswith(f"clusterddp: error: {path}:{row}: {key}: "), err
    assert message in err, err


@pytest.mark.parametrize("value", [-1, 1 << 31, 10 ** 30, "2", True, 2.0, None])
def test_hand_built_restarts_are_refused_by_the_renderer_itself(value: object) -> None:
    """A JobSpec built by hand with a bad restarts never renders: one line naming 'restarts'."""
    job = replace(load_job(HERE / "jobs" / "minimal.yaml"), restarts=value)
    with pytest.raises(JobSpecError, match=r"minimal.yaml:?\d*: restarts: must be an integer from 0 to 2147483647"):
        render_openpai(job, "minimal.yaml")


def test_secrets_and_job_env_are_never_rendered() -> None:
    """No 'secrets' key, and the job's env values (API keys...) stay out of the spec."""
    text = render_fixture("full")
    assert "secrets" not in yaml.safe_load(text)
    assert "do-not-render-this-value" not in text and "WANDB_API_KEY" not in text
    assert not {"secrets", "token", "password"} & set(OpenPAISpec.__dataclass_fields__)


def test_job_path_is_quoted_in_the_command() -> None:
    """A job path with a space becomes one shell word in the command."""
    job = load_job(HERE / "jobs" / "minimal.yaml")
    spec = yaml.safe_load(render_openpai(job, "my jobs/a b.yaml"))
    assert spec["taskRoles"]["worker"]["commands"] == ["clusterddp run 'my jobs/a b.yaml'"]


@pytest.mark.parametrize("change, key, message", [
    ({"container": ContainerSpec()}, "container.image", "required to render"),
    ({"container": ContainerSpec(image="./img.sqsh")}, "container.image", "Docker image"),
    ({"name": "a.b"}, "name", "not a valid OpenPAI job name"),
    ({"backend": "nccl"}, "openpai.gpu", "is 0 but the backend is nccl"),
    ({"nproc_per_node": "gpu"}, "openpai.gpu", "nproc_per_node is 'gpu'"),
    ({"nproc_per_node": 8, "openpai": OpenPAISpec(gpu=4)}, "openpai.gpu", "one GPU per worker"),
    ({"openpai": OpenPAISpec(setup=("pip install x  # pin later",))}, r"openpai.setup\[0\]", "comment"),
    ({"openpai": OpenPAISpec(setup=("ok", "sleep 1 &"))}, r"openpai.setup\[1\]", "ends with '&'"),
    ({"openpai": OpenPAISpec(setup=("echo 'x",))}, r"openpai.setup\[0\]", "unclosed ' quote"),
])
def test_render_refuses_what_would_fail_later(change: dict, key: str, message: str) -> None:
    """Missing or inconsistent values fail at render time, naming the job-file key (and its
    line where the file has it: these changes are made in memory, minimal.yaml has no openpai:)."""
    job = replace(load_job(HERE / "jobs" / "minimal.yaml"), **change)
    with pytest.raises(JobSpecError, match=rf"minimal.yaml(:[0-9]+)?: {key}: .*{message}"):
        render_openpai(job, "minimal.yaml")


def test_name_override_wins_and_is_checked() -> None:
    """--name replaces the job's name, and a bad one is refused like openpai.name."""
    job = replace(load_job(HERE / "jobs" / "minimal.yaml"), name="a.b")
    assert yaml.safe_load(render_openpai(job, "j.yaml", name="ab-1"))["name"] == "ab-1"
    with pytest.raises(JobSpecError, match="openpai.name"):
        render_openpai(job, "j.yaml", name="a b")


@pytest.mark.parametrize("line, problem", [
    ("git clone https://x/y.git && cd y", None),
    ("echo a#b 'c # d' \"#e\" \\#f", None),
    ("echo $# done", None),
    ("# just a comment", "comment"),
    ("make; # build", "comment"),
    ("make;", "ends with ';'"),
    ("a |", "ends with '|'"),
    ("tail -f log \\", "ends with"),
    ("echo \"unclosed", "unclosed"),
    ("   ", "is empty"),
])
def test_chain_problem_table(line: str, problem: str | None) -> None:
    """Setup lines must survive OpenPAI's ' && ' join; '#' only counts at a word start, unquoted."""
    got = chain_problem(line)
    assert (got is None) if problem is None else (problem in (got or ""))


@pytest.mark.parametrize("value", [
    "plain", "with space", "pytorch/pytorch:2.4", "yes", "no", "null", "~", "true", "1", "0o17", "1e3",
    "12:30", "-x", "a: b", "a #b", "#x", "[1]", "{a}", "'q'", '"dq"', "back\\slash", "tab\there",
    "line\nbreak", "<% $parameters.x %>", "@at", "`tick`", "", " lead", "trail ", "ünï", "😀", "\u2028",
    "%percent", "*star", "&anchor", "!tag", "|pipe", ">fold", "...", "---", "a,b",
])
def test_yaml_scalar_round_trips(value: str) -> None:
    """Every string reads back unchanged, as a string, alone and inside a flow mapping."""
    scalar = yaml_scalar(value)
    assert yaml.safe_load(f"k: {scalar}") == {"k": value}
    assert yaml.safe_load(f"m: {{k: {scalar}, z: {scalar}}}") == {"m": {"k": value, "z": value}}
    assert yaml.safe_load(f"l:\n  - {scalar}\n") == {"l": [value]}


def test_render_action_prints_or_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'render openpai JOB' prints the spec; '-o FILE' writes the same text and prints it nowhere."""
    job = str(HERE / "jobs" / "minimal.yaml")
    assert OpenPAIScheduler().main(OpenPAIOptions("render", job=job)) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "spec.yaml"
    assert OpenPAIScheduler().main(OpenPAIOptions("render", job=job, output=str(out))) == 0
    assert out.read_text() == printed and capsys.readouterr().out == ""
    assert server_errors(printed) == []


def test_submit_dry_run_sends_nothing_and_needs_no_token(capsys: pytest.CaptureFixture[str]) -> None:
    """'submit --dry-run' prints the endpoint and the spec; no token, no connection."""
    job = str(HERE / "jobs" / "minimal.yaml")
    assert OpenPAIScheduler().main(OpenPAIOptions("submit", job=job, url="https://pai.example/", dry_run=True), env={}) == 0
    out = capsys.readouterr().out
    assert out.startswith("# dry run: would POST this to https://pai.example/rest-server/api/v2/jobs")
    assert yaml.safe_load(out)["name"] == "minimal"


@pytest.mark.parametrize("role, label", [("False", "null"), ("yes", "Off"), ("NULL", "true")])
def test_identifiers_that_yaml_reads_as_booleans_stay_strings(role: str, label: str) -> None:
    """A task role 'False' or a port label 'null' is a valid identifier: it renders as a string key, not a YAML bool."""
    from clusterddp.sections.container import ContainerSpec
    from clusterddp.sections.openpai import OpenPAISpec
    from clusterddp.spec import JobSpec

    job = JobSpec(name="j", script="t.py", container=ContainerSpec(image="img"), openpai=OpenPAISpec(task_role=role, port_label=label))
    spec = yaml.safe_load(render_openpai(job, "t.yaml"))
    assert list(spec["taskRoles"]) == [role]
    assert label in spec["taskRoles"][role]["resourcePerInstance"]["ports"]
