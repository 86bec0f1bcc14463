"""The scheduler interface (clusterddp.schedulers.api): a scheduler plugs in with one registry
line and no change to cli.py, and a rendered request prints exactly what ``render`` prints."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pytest

from clusterddp import cli
from clusterddp.schedulers import SCHEDULERS, get_scheduler
from clusterddp.schedulers.api import Flag, RenderedRequest, Scheduler
from clusterddp.spec import JobSpec, load_job
from tests.conftest import REPO

JOBS = sorted(str(path) for path in (REPO / "jobs").glob("*.yaml"))


@dataclass(frozen=True)
class ToyOptions:
    """The toy scheduler's options, one field per flag."""

    action: str
    job: str | None = None
    job_id: str | None = None
    greeting: str = "hello"
    replicas: int = 1
    spool: str | None = None


class ToyScheduler(Scheduler[ToyOptions]):
    """A scheduler that lives only in this test: renders a line per replica, submits by
    writing the request into a spool directory, and prints the logs of an id."""

    name = "toy"
    actions = ("render", "submit", "logs")
    options_type = ToyOptions
    descriptions = {"render": "Render the job as toy lines.", "submit": "Spool the toy lines.",
                    "logs": "Show a toy job's logs."}
    flags = (
        Flag("job", help="job file", actions=("render", "submit")),
        Flag("job_id", metavar="TOY-ID", help="the id submit printed", actions=("logs",)),
        Flag("greeting", ("--greeting",), help="a word every toy line carries", actions=("render", "submit")),
        Flag("replicas", ("--replicas",), convert=int, default=1, help="toy lines to render",
             actions=("render", "submit")),
        Flag("spool", ("--spool",), help="directory submit writes the request into", actions=("submit",)),
    )
    #: The mappings ``options`` was given, to show the scheduler never sees argparse.
    seen: list[object] = []

    def options(self, action: str, values: Mapping[str, Any]) -> ToyOptions:
        ToyScheduler.seen.append(values)
        return super().options(action, values)

    def render(self, job: JobSpec, options: ToyOptions) -> RenderedRequest:
        lines = "".join(f"toy {job.name} {options.greeting} {i}\n" for i in range(options.replicas))
        return RenderedRequest(lines, "copy into the spool directory", job)

    def submit(self, request: RenderedRequest, options: ToyOptions, env: Mapping[str, str]) -> int:
        Path(str(options.spool), "submitted").write_text(str(request))
        print(f"toy-{request.job.name}")
        return 0

    def logs(self, options: ToyOptions, env: Mapping[str, str]) -> int:
        print(f"logs of {options.job_id}")
        return 0


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registers the toy scheduler: the one line a new scheduler adds to SCHEDULERS."""
    monkeypatch.setitem(SCHEDULERS, "toy", ToyScheduler)


def test_a_registered_scheduler_lists_its_own_flags_in_help(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    """'clusterddp render toy --help' shows the toy's flags and description; 'clusterddp --help' names it."""
    with pytest.raises(SystemExit) as info:
        cli.main(["render", "toy", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert " ".join(out.split()).startswith(
        "usage: clusterddp render toy [-h] [--greeting GREETING] [--replicas REPLICAS] job")
    assert "Render the job as toy lines." in out and "a word every toy line carries" in out
    assert "--spool" not in out  # a submit-only flag
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "on a scheduler (slurm, openpai, k8s, toy)" in capsys.readouterr().out


def test_render_prints_the_request_of_a_registered_scheduler(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    """'clusterddp render toy JOB --greeting hi --replicas 2' prints the toy's request; the scheduler got a dict."""
    ToyScheduler.seen.clear()
    assert cli.main(["render", "toy", JOBS[0], "--greeting", "hi", "--replicas", "2"]) == 0
    name = load_job(JOBS[0]).name
    assert capsys.readouterr().out == f"toy {name} hi 0\ntoy {name} hi 1\n"
    assert [type(values) for values in ToyScheduler.seen] == [dict]


def test_submit_calls_the_registered_schedulers_submit(
        toy: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'clusterddp submit toy JOB --spool DIR' hands the rendered request to the toy's submit."""
    assert cli.main(["submit", "toy", JOBS[0], "--spool", str(tmp_path)]) == 0
    name = load_job(JOBS[0]).name
    assert capsys.readouterr().out == f"toy-{name}\n"
    assert (tmp_path / "submitted").read_text() == f"toy {name} hello 0\n"


def test_logs_reaches_the_registered_scheduler(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    """'clusterddp logs toy ID' runs the toy's logs with its positional argument."""
    assert cli.main(["logs", "toy", "toy-7"]) == 0
    assert capsys.readouterr().out == "logs of toy-7\n"


def test_an_action_the_scheduler_lacks_is_refused_before_its_flags(
        toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    """'clusterddp stop toy --bogus': one line listing what toy supports, exit 2, the flag never read."""
    assert cli.main(["stop", "toy", "--bogus"]) == 2
    assert capsys.readouterr().err == "clusterddp: error: toy supports render, submit, logs, not 'stop'\n"


def test_a_flag_that_fails_its_converter_is_one_line(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    """'--replicas two' fails the toy's int converter: one line naming the command and the flag, exit 2."""
    assert cli.main(["render", "toy", JOBS[0], "--replicas", "two"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clusterddp: error: clusterddp render toy: ") and err.count("\n") == 1, err
    assert "--replicas" in err and "'two'" in err, err  # argparse's own words in between are not pinned
    assert err.endswith(" (hint: see 'clusterddp render toy --help')\n"), err


def test_a_scheduler_that_lists_an_action_it_lacks_fails_at_definition() -> None:
    """A class listing 'stop' without implementing it is a TypeError when defined, not when a user runs it."""
    with pytest.raises(TypeError, match="lists 'stop' but does not implement it"):
        class Broken(ToyScheduler):
            actions = ("render", "stop")


@pytest.mark.parametrize("name", ["slurm", "openpai"])
@pytest.mark.parametrize("job", JOBS, ids=lambda path: Path(path).stem)
def test_the_rendered_request_prints_exactly_what_render_prints(
        name: str, job: str, capsys: pytest.CaptureFixture[str]) -> None:
    """str(scheduler.render(job, options)) is byte for byte 'clusterddp render NAME JOB'; it names its submit."""
    assert cli.main(["render", name, job]) == 0
    printed = capsys.readouterr().out
    scheduler = get_scheduler(name)
    request = scheduler.render(load_job(job), scheduler.options("render", {"job": job}))
    assert str(request) == printed and printed
    assert {"slurm": "sbatch", "openpai": "POST"}[name] in request.submit_command


def test_no_scheduler_module_imports_argparse_and_cli_names_no_scheduler() -> None:
    """Schedulers declare flags as data (DESIGN: nothing below cli sees argparse); cli.py has no scheduler name."""
    for path in sorted((REPO / "clusterddp" / "schedulers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert "argparse" not in names, f"{path.name} imports argparse"
    source = (REPO / "clusterddp" / "cli.py").read_text(encoding="utf-8")
    code = "\n".join(line.split("#")[0] for line in source.splitlines())
    assert all(name not in code for name in SCHEDULERS), "cli.py names a scheduler outside a comment"
