"""What the scheduler registry (the package) and every scheduler (``api``, ``slurm`` ...) share.

Apart from the package so that ``api`` does not import the package that names it (a circle,
tests/core/test_layers.py); light, so the CLI reads ``ACTIONS`` without importing a scheduler.
"""

from __future__ import annotations

from clusterddp.atomicfile import write_atomically

#: Every action a scheduler may have, in the order the CLI lists them (``api.Scheduler``).
ACTIONS = ("render", "submit", "status", "stop", "logs")


def write_output(path: str, text: str) -> None:
    """Write a rendered file whole or not at all (a full disk keeps the old one); a path that
    cannot be written is one line naming it, not a traceback."""
    write_atomically(path, text)
