"""Schedulers that take a rendered job: a plain dict of name -> module, imported lazily.

Each module offers ``main(action, argv) -> int`` for the actions it supports
(``render``, ``submit``, ``status``, ``stop``) and parses its own flags, so the CLI stays thin
and importing the CLI imports no scheduler.
"""

from __future__ import annotations

import importlib
from types import ModuleType

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
