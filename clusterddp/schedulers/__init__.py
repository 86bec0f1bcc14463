"""Schedulers that take a rendered job: a plain dict of name -> module, imported lazily.

Each module offers ``check_action(action)`` and ``main(options) -> int`` for the actions it
supports (``render``, ``submit``, ``status``, ``stop``); the CLI parses the flags into the
module's options dataclass. Importing the CLI imports no scheduler.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from clusterddp.atomicfile import write_atomically
from clusterddp.errors import ClusterDDPError

SCHEDULERS: dict[str, str] = {
    "slurm": "clusterddp.schedulers.slurm",
    "openpai": "clusterddp.schedulers.openpai",
}


def get_scheduler(name: str) -> ModuleType:
    """The scheduler module for ``name``; an error listing the known names otherwise."""
    if name not in SCHEDULERS:
        raise ClusterDDPError(f"unknown scheduler {name!r}; known: {', '.join(sorted(SCHEDULERS))}")
    return importlib.import_module(SCHEDULERS[name])


def write_output(path: str, text: str) -> None:
    """Write a rendered file whole or not at all (a full disk keeps the old one); a path that
    cannot be written is one line naming it, not a traceback."""
    write_atomically(path, text)
