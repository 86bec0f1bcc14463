"""README's two set-up commands stay true: CI runs the second one verbatim."""

from __future__ import annotations

import re

from tests.conftest import REPO


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```\n(.*?)```", quick, flags=re.S)]


def test_readme_has_exactly_two_setup_commands() -> None:
    """The quick start has two one-line commands: run the default job, run the tests."""
    commands = _readme_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert commands[0].endswith("clusterddp run jobs/hello.yaml")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run contains the README's test command verbatim."""
    assert _readme_commands()[1] in (REPO / ".ci" / "run").read_text()


def test_both_commands_install_the_lock() -> None:
    """Both quick-start commands (and so CI) install with ``-c constraints.txt``, and the lock pins every line exactly."""
    assert all(" -c constraints.txt " in command for command in _readme_commands())
    pins = [line for line in (REPO / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+", line) for line in pins), pins
    names = {line.split("==")[0].lower().replace("_", "-") for line in pins}
    assert {"pyyaml", "paramiko", "torch", "pytest", "mypy"} <= names and "clusterddp" not in names


def test_the_placement_table_lists_every_environment_in_order() -> None:
    """README's "Where a node learns its place" has one row per environment of envs.ORDER, in that order (mpi too)."""
    from clusterddp.envs import environment_classes

    section = (REPO / "README.md").read_text().split("### Where a node learns its place", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1].strip().lower().replace(" ", "") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| environment")]
    assert len(rows) == len(list(environment_classes())), rows
    for row, cls in zip(rows, environment_classes()):
        assert cls.name in row, (row, cls.name)
