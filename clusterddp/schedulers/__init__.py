"""Schedulers that take a rendered job: a registry of name -> class, imported lazily.

Each scheduler is a ``clusterddp.schedulers.api.Scheduler``: its name, its actions
(``render``, ``submit``, ``status``, ``stop``, ``logs``), its flags as data, a pure
``render`` and the actions that talk to the platform. A new scheduler is one module and one
line here. Importing the CLI imports no scheduler.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from clusterddp.errors import ClusterDDPError
from clusterddp.schedulers.common import ACTIONS, write_output
from clusterddp.validate import shown

if TYPE_CHECKING:
    from clusterddp.schedulers.api import Scheduler

#: name -> ``"module:Class"`` (imported on first use) or the class itself.
SCHEDULERS: dict[str, str | type[Scheduler[Any]]] = {
    "slurm": "clusterddp.schedulers.slurm:SlurmScheduler",
    "openpai": "clusterddp.schedulers.openpai.scheduler:OpenPAIScheduler",
    "k8s": "clusterddp.schedulers.kubernetes.scheduler:KubernetesScheduler",
}


def get_scheduler(name: str) -> Scheduler[Any]:
    """The scheduler called ``name``; an error listing the known names otherwise."""
    if name not in SCHEDULERS:
        raise ClusterDDPError(f"unknown scheduler {shown(name)}; known: {', '.join(sorted(SCHEDULERS))}")
    entry = SCHEDULERS[name]
    if isinstance(entry, str):
        module, _, attribute = entry.partition(":")
        entry = getattr(importlib.import_module(module), attribute)
    return entry()


__all__ = ["ACTIONS", "SCHEDULERS", "get_scheduler", "write_output"]
