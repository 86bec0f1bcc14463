"""The restart policy and the launcher's exit code, with plain data (launch/restart/policy.py)."""

from __future__ import annotations

import signal

import pytest

from clusterddp import exitcodes
from clusterddp.launch.observe.exits import WorkerExit
from clusterddp.launch.restart.policy import MAX_BACKOFF, RestartPolicy, exit_code


def _exit(returncode: int, rank: int = 0) -> WorkerExit:
    return WorkerExit(host="h", rank=rank, local_rank=rank, pid=100 + rank, returncode=returncode, log="l")


@pytest.mark.parametrize("restarts, done, returncode, stopping, expected", [
    (0, 0, 1, False, None),                          # no restarts allowed
    (3, 0, 1, False, 0.0),                           # the first restart at once
    (3, 1, 1, False, 1.0),                           # then after 1 s (a crash loop)
    (3, 2, -signal.SIGSEGV, False, 2.0),             # a signal is restarted too
    (3, 3, 1, False, None),                          # restarts used up
    (3, 0, 1, True, None),                           # the launcher is stopping
    (3, 0, exitcodes.PREEMPTED, False, None),        # the scheduler requeues
    (3, 0, exitcodes.NONFINITE_LOSS, False, None),   # same state, same NaN
    (100, 10, 1, False, MAX_BACKOFF),                # the backoff is capped
    (1, 0, exitcodes.HANG, False, 0.0),              # a hang is a failure, restarted too
])
def test_backoff(restarts: int, done: int, returncode: int, stopping: bool, expected: float | None) -> None:
    """Restart at once, then after 2**(n-1) seconds (capped) until the restarts are used up, never for 75, 65 or a stop."""
    assert RestartPolicy(restarts).backoff(done, _exit(returncode).exit_code, stopping) == expected


def test_success_is_never_restarted() -> None:
    """An attempt without a failure is the last one."""
    assert RestartPolicy(5).backoff(0, None, stopping=False) is None


@pytest.mark.parametrize("root, exits, hang, stop_signal, expected", [
    (None, [], True, None, exitcodes.HANG),                                  # a hang wins
    (_exit(3), [_exit(3), _exit(75, 1)], False, None, 3),                    # the first failure decides
    (_exit(-signal.SIGSEGV), [], False, signal.SIGTERM, 128 + signal.SIGSEGV),
    (None, [_exit(75), _exit(-signal.SIGKILL, 1)], False, signal.SIGTERM, exitcodes.PREEMPTED),
    (None, [_exit(-signal.SIGTERM)], False, signal.SIGTERM, 128 + signal.SIGTERM),
    (None, [], False, None, 1),                                              # stopped for another reason
])
def test_exit_code(root: WorkerExit | None, exits: list[WorkerExit], hang: bool, stop_signal: int | None,
                   expected: int) -> None:
    """The launcher's exit code after a failure or a stop."""
    assert exit_code(root, exits, hang, stop_signal) == expected
