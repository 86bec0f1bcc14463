"""The restart policy of the local group, and the launcher's exit code: pure, plain data in.

``restarts: N`` restarts this node's group after a failure, with an exponential backoff
(1 s, 2 s, 4 s, ... up to MAX_BACKOFF), except for exits a restart cannot fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from clusterddp import exitcodes
from clusterddp.launch.report import WorkerExit

#: The longest pause between restarts (clusterddp.exitcodes, shared with every restarter).
MAX_BACKOFF = exitcodes.MAX_BACKOFF


@dataclass(frozen=True)
class RestartPolicy:
    """How many times the local group may be restarted, and how long to wait before each."""

    restarts: int = 0

    def backoff(self, restarts_done: int, root: WorkerExit | None, stopping: bool) -> float | None:
        """Seconds to wait before the next restart, or None when the attempt that just ended
        (``restarts_done`` restarts so far, first failure ``root``) is the last one: it
        succeeded, the launcher is stopping, the restarts are used up, or the exit is one a
        restart cannot fix."""
        if root is None or stopping or restarts_done >= self.restarts or root.exit_code in exitcodes.NOT_RESTARTED:
            return None
        return backoff_seconds(restarts_done)


def backoff_seconds(restarts_done: int) -> float:
    """1 s, 2 s, 4 s ... at most MAX_BACKOFF: the pause before restart ``restarts_done + 1``."""
    return min(float(2 ** min(restarts_done, 16)), MAX_BACKOFF)


def exit_code(root: WorkerExit | None, exits: Sequence[WorkerExit], hang: bool, stop_signal: int | None) -> int:
    """The launcher's exit code after a failure or a stop (a success is 0, decided before)."""
    if hang:
        return exitcodes.HANG
    if root is not None:
        # The first failure decides, also when peers then saved checkpoints on our SIGTERM
        # and exited 75: a crashed job must not look preempted and be requeued.
        return root.exit_code or 1
    if any(e.returncode == exitcodes.PREEMPTED for e in exits):
        # Stopped by a signal (a scheduler's SIGTERM) while the workers saved checkpoints:
        # report 75 so SLURM's requeue logic sees a preemption, not 143.
        return exitcodes.PREEMPTED
    if stop_signal is not None:
        return 128 + stop_signal
    return 1
