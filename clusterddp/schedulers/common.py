"""What the scheduler registry (the package) and every scheduler (``api``, ``slurm`` ...) share.

Apart from the package so that ``api`` does not import the package that names it (a circle,
tests/core/test_layers.py); light, so the CLI reads ``ACTIONS`` without importing a scheduler.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from clusterddp.atomicfile import WriteError, write_atomically
from clusterddp.errors import ClusterDDPError
from clusterddp.registry import store
from clusterddp.registry.store import FINAL, RunRecord

#: Every action a scheduler may have, in the order the CLI lists them (``api.Scheduler``).
ACTIONS = ("render", "submit", "status", "stop", "logs")


def write_output(path: str, text: str) -> None:
    """Write a rendered file whole or not at all (a full disk keeps the old one); a path that
    cannot be written is one line naming it, not a traceback."""
    write_atomically(path, text)


def keep_final(records: Sequence[RunRecord], changes: Mapping[str, Mapping[str, Any]]) -> None:
    """A state a platform reported as final goes into the record at once (with when it was
    first seen over), so ``ls`` never asks again and the state stays right after the platform
    forgets the job. Best effort: a registry that cannot be written costs nothing here."""
    for record in records:
        change = dict(changes.get(record.run_id) or {})
        if change.get("state") not in FINAL:
            continue
        change.pop("note", None)
        if record.ended is None:
            change.setdefault("ended", store.now())
        try:
            store.update(record.run_id, **change)
        except (WriteError, ClusterDDPError, OSError):
            pass
