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


def _layout() -> list[tuple[str, str]]:
    """README's "Layout" block as (path, what it says) rows: a row starts at column 0 with its
    path; indented lines continue the row above."""
    block = (REPO / "README.md").read_text().split("## Layout", 1)[1].split("```")[1]
    rows: list[list[str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if line[0] != " ":
            path, _, text = line.partition(" ")
            rows.append([path, text.strip()])
        else:
            rows[-1][1] += " " + line.strip()
    return [(path, text) for path, text in rows]


def _named_files(text: str) -> list[str]:
    """The ``*.py`` names a row's text mentions, relative to the row's folder (``openpai*.py`` a
    pattern); a name with a folder (``launch/options.py``) is relative to clusterddp/."""
    return re.findall(r"[\w/*]+\.py\b", text)


def test_every_path_the_layout_names_exists() -> None:
    """Every folder and module README's Layout names is in the tree: a module moved, renamed or
    split is moved in the Layout too (it once showed flat openpai*.py and kubernetes*.py
    modules two turns after they became packages)."""
    missing = []
    for path, text in _layout():
        entry = REPO / path
        if not entry.exists():
            missing.append(path)
            continue
        base = entry if entry.is_dir() else entry.parent
        missing += [f"{path}: {name}" for name in _named_files(text)
                    if not list(base.glob(name)) and not list((REPO / "clusterddp").glob(name))]
    assert missing == [], f"README's Layout names what the tree does not have: {missing}"


def test_the_layout_names_every_package() -> None:
    """Every package under clusterddp/ has its row in README's Layout, and every module of a
    launch package is named in its row (a newcomer finds a concept by its folder there)."""
    packages = sorted(f"{p.parent.relative_to(REPO)}/" for p in (REPO / "clusterddp").rglob("*/__init__.py"))
    rows = dict(_layout())
    missing = [package for package in packages if package not in rows]
    assert missing == [], f"packages missing from README's Layout: {missing}"
    unnamed = [f"{package}{module.name}" for package in packages if package.startswith("clusterddp/launch/")
               for module in sorted((REPO / package).glob("*.py"))
               if module.name != "__init__.py" and module.name not in _named_files(rows[package])]
    assert unnamed == [], f"modules of launch's packages missing from their Layout row: {unnamed}"
