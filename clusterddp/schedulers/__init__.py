"""Schedulers that take a rendered job: a plain dict of name -> module, imported lazily.

Each module offers ``main(action, argv) -> int`` for the actions it supports
(``render``, ``submit``, ``status``, ``stop``) and parses its own flags, so the CLI stays thin
and importing the CLI imports no scheduler.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from clusterddp.errors import ClusterDDPError
from clusterddp.validate import shown

SCHEDULERS: dict[str, str] = {
    "slurm": "clusterddp.schedulers.slurm",
    "openpai": "clusterddp.schedulers.openpai",
}


def get_scheduler(name: str) -> ModuleType:
    """The scheduler module for ``name``; an error listing the known names otherwise."""
    if name not in SCHEDULERS:
        raise ClusterDDPError(f"unknown scheduler {name!r}; known: {', '.join(sorted(SCHEDULERS))}")
    return importlib.import_module(SCHEDULERS[name])


class OneLineParser(argparse.ArgumentParser):
    """The schedulers' flags: a usage mistake is one ``clusterddp: error:`` line and exit 2,
    like every other user error, instead of argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        raise ClusterDDPError(f"{self.prog}: {message}", f"see '{self.prog} --help'")


def write_output(path: str, text: str) -> None:
    """Write a rendered file; a path that cannot be written is one line, not a traceback."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ClusterDDPError(f"{shown(path)}: cannot write: {exc.strerror or exc}") from None
