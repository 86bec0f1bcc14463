"""The run flags' one table (``launch.flags.RUN_FLAGS``): the parser, the variables, the job
overrides and the SSH head's argv for every host all come from its rows."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from clusterddp import cli, validate
from clusterddp.launch import flags
from clusterddp.launch.ssh.fanout import fanout_options
from clusterddp.launch.ssh.attempt import launcher_argv
from clusterddp.spec import JobSpec
from tests.conftest import REPO

#: The longest function the package may hold (issue 19: small functions, a parser built from data).
MAX_FUNCTION_LINES = 60


def _remote_argv(argv: list[str], env: dict[str, str] | None = None) -> tuple[str, ...]:
    """What the SSH head runs on a host for ``clusterddp run /jobs/a.yaml ARGV``: the head's
    options as the CLI builds them, its passed-on flags as ``fanout_options`` writes them, in
    the command ``attempt.plan_launchers`` builds with ``launcher_argv``."""
    args = cli._typed(cli.build_parser().parse_args(["run", "/jobs/a.yaml", *argv]), env or {})
    passed_on = fanout_options(cli.run_options(args)).launcher_args
    return launcher_argv("/py", ["/jobs/a.yaml"], nnodes=2, node_rank=1, master_addr="10.0.0.1",
                         master_port=29500, run_id="r", nproc=2, keepalive_timeout=6.0, extra=passed_on)


def _remote_parse(argv: tuple[str, ...]) -> dict[str, object]:
    """The remote launcher's own reading of that command (its flags, converted)."""
    assert argv[:4] == ("/py", "-m", "clusterddp", "run")
    return vars(cli._typed(cli.build_parser().parse_args(list(argv[3:])), {}))


def test_device_flags_reach_every_remote_launcher() -> None:
    """--cpu-affinity and --virtual-local-rank given to the head are passed on to each host's launcher."""
    argv = _remote_argv(["--cpu-affinity", "none", "--virtual-local-rank"])
    assert argv[-3:] == ("--cpu-affinity", "none", "--virtual-local-rank")
    assert "--cpu-affinity" not in _remote_argv([])
    remote = _remote_parse(argv)
    assert remote["cpu_affinity"] == "none" and remote["virtual_local_rank"] is True


def test_job_overrides_travel_as_typed() -> None:
    """Every passed-on flag, from a flag or its CLUSTERDDP_* variable, reaches the remote launcher with the same value."""
    argv = _remote_argv(["--restarts", "2", "--grace-period", "3", "--log-ranks", "3,0", "--no-prefix"],
                        {"CLUSTERDDP_PYTHON": "/usr/bin/python3", "CLUSTERDDP_LOG_DIR": "/tmp/l"})
    remote = _remote_parse(argv)
    assert (remote["restarts"], remote["grace_period"], remote["python"], remote["log_dir"]) == (
        2, 3.0, "/usr/bin/python3", "/tmp/l")
    assert remote["log_ranks"] == frozenset({0, 3}) and remote["no_prefix"] is True


def test_a_new_row_reaches_the_parser_and_every_remote_launcher(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A throwaway row, and nothing else, gives a checked flag with help and a variable that the SSH head passes on."""
    row = flags.Flag("--throwaway-knob", flags.SUPERVISION, "a knob only this test knows",
                     flags.checked(flags.integer, validate.non_negative_problem), variable=True, passed_on=True)
    monkeypatch.setattr(flags, "RUN_FLAGS", (*flags.RUN_FLAGS, row))
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "--throwaway-knob THROWAWAY_KNOB\n" in capsys.readouterr().out
    argv = _remote_argv(["--throwaway-knob", "7"])
    assert argv[-2:] == ("--throwaway-knob", "7") and _remote_parse(argv)["throwaway_knob"] == 7
    assert _remote_argv([], {"CLUSTERDDP_THROWAWAY_KNOB": "3"})[-2:] == ("--throwaway-knob", "3")
    assert "--throwaway-knob" not in _remote_argv([])
    assert cli.main(["run", "/jobs/a.yaml", "--throwaway-knob=-1"]) == 2
    assert capsys.readouterr().err == "clusterddp: error: --throwaway-knob: must be >= 0, got -1\n"


def test_every_job_key_is_a_jobspec_field() -> None:
    """A row's job key names a JobSpec field (dotted into its section), so the override lands."""
    for row in flags.RUN_FLAGS:
        value: object = JobSpec(name="x", script="x")
        for part in (row.job_key or "").split(".") if row.job_key else ():
            names = {item.name for item in dataclasses.fields(value)} if dataclasses.is_dataclass(value) else set()
            assert part in names, f"{row.name}: {row.job_key} is not a JobSpec key"
            value = getattr(value, part)


def test_cli_names_no_run_flag() -> None:
    """cli.py only turns rows into argparse: no run flag is spelled out there, but as another command's own flag."""
    tree = ast.parse((REPO / "clusterddp" / "cli.py").read_text(encoding="utf-8"))
    other_commands = {id(node) for function in tree.body if isinstance(function, ast.FunctionDef)
                      and function.name == "_add_tool_commands" for node in ast.walk(function)}
    names = {row.name for row in flags.RUN_FLAGS}
    written = [f"cli.py:{node.lineno} {node.value}" for node in ast.walk(tree) if isinstance(node, ast.Constant)
               and node.value in names and id(node) not in other_commands]
    assert not written, f"run flags spelled out in cli.py, not only in their rows (launch/flags.py): {written}"


def test_no_function_is_over_60_lines() -> None:
    """Every function of the package (launcher, train, templates) fits on a screen: at most 60 lines."""
    long = []
    for base in (REPO / "clusterddp", REPO / "templates"):
        for path in sorted(base.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
