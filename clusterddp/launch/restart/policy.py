"""The restart policy of the local group, and the launcher's exit code: pure, plain data in.

``restarts: N`` restarts this node's group after a failure (a worker's non-zero exit, or a
hang: exitcodes.HANG, as the SSH head restarts the whole job after one), at once the first
time, then with an exponential backoff (1 s, 2 s, 4 s, ... up to MAX_BACKOFF), except for
exits a restart cannot fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from clusterddp import exitcodes
from clusterddp.launch.observe.exits import WorkerExit

#: The longest pause between restarts (clusterddp.exitcodes, shared with every restarter).
MAX_BACKOFF = exitcodes.MAX_BACKOFF


@dataclass(frozen=True)
class RestartPolicy:
    """How many times the local group may be restarted, and how long to wait before each."""

    restarts: int = 0

    def backoff(self, restarts_done: int, failure: int | None, stopping: bool) -> float | None:
        """Seconds to wait before the next restart, or None when the attempt that just ended
        (``restarts_done`` restarts so far; ``failure``: the exit code its failure gives, the
        first failed worker's or exitcodes.HANG, None when nothing failed) is the last one: it
        succeeded, the launcher is stopping, the restarts are used up, or the exit is one a
        restart cannot fix."""
        if failure is None or stopping or restarts_done >= self.restarts or failure in exitcodes.NOT_RESTARTED:
            return None
        return backoff_seconds(restarts_done)


@dataclass(frozen=True)
class AttemptEnd:
    """How one start of this node's group ended, for the lines printed after restarts (the
    SSH head's ``ssh.attempt.Attempt`` lines share ``attempt_line``)."""

    #: 0 for the first start; TORCHELASTIC_RESTART_COUNT of its workers (less first_attempt).
    number: int
    ranks: int
    host: str
    exit_code: int
    #: ``rank 1 on node1 exit code 3``, or the hang's reason: the first failure, if any.
    failure: str | None
    seconds: float

    def line(self) -> str:
        """``attempt 1: 2 rank(s) on node1: exit 124 after 3.1s; first failure hang: ...``"""
        return attempt_line(self.number, f"{self.ranks} rank(s) on {self.host}", self.exit_code, self.seconds,
                            self.failure)


def attempt_line(number: int, where: str, exit_code: int, seconds: float, failure: str | None) -> str:
    """One attempt in the lines printed after restarts, the same on one node and from the SSH
    head: ``attempt N: WHERE: finished|exit C after Ts[; first failure F]``."""
    how = "finished" if exit_code == 0 else f"exit {exit_code}"
    return f"attempt {number + 1}: {where}: {how} after {seconds:.1f}s" + (
        f"; first failure {failure}" if failure else "")


def end_reason(policy: RestartPolicy, restarts_done: int, failure: int | None, stopping: str | None) -> str:
    """Why the attempt that just ended is (or is not) followed by a restart, in a few words,
    for the event log (the verdict on a failure that will repeat is ``verdict.will_repeat``)."""
    if failure is None:
        return f"stopping: {stopping}" if stopping else "finished"
    if stopping:
        return f"stopping: {stopping}"
    if failure in exitcodes.NOT_RESTARTED:
        return f"exit {failure} is never restarted"
    if restarts_done >= policy.restarts:
        return f"restarts used up ({policy.restarts})"
    return "a transient failure: restarting"


def backoff_seconds(restarts_done: int) -> float:
    """No pause before the first restart, then 1 s, 2 s, 4 s ... at most MAX_BACKOFF: the pause
    before restart ``restarts_done + 1``. Backoff is for crash loops: one fault (a killed
    rank, a lost host) is restarted at once; only a failure that keeps coming waits."""
    if restarts_done <= 0:
        return 0.0
    return min(float(2 ** min(restarts_done - 1, 16)), MAX_BACKOFF)


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
