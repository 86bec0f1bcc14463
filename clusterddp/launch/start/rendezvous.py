"""Wait, bounded, for the master's name to resolve before any worker starts.

On Kubernetes node 0's name (``<job>-node-0-0.<subdomain>``) exists in DNS only once node 0's
pod does, and pods start in any order: a worker that resolves it too early fails inside
``init_process_group`` with a gaierror traceback per rank, or each rank retries on its own
until torch's timeout. So the launcher resolves it first, on every node (node 0 too: its own
record appears with it), retrying with a doubling pause, saying once that it waits and once
more a minute, and stops with one line when the name never resolves. An address resolves at
once, so SSH, SLURM and local runs do not notice.
"""

from __future__ import annotations

import socket
import time
from typing import Callable, Mapping

from clusterddp.errors import LaunchError
from clusterddp.validate import seconds_problem

#: Seconds to wait for the master's name: long enough for a pod to be scheduled, pull its
#: image and start; JobSet and torch's own store timeouts are of the same order.
DEFAULT_MASTER_WAIT = 300.0
#: Overrides the wait, in seconds (0: one try).
MASTER_WAIT_ENV = "CLUSTERDDP_MASTER_WAIT"
#: The pause between tries doubles from FIRST_PAUSE up to MAX_PAUSE.
FIRST_PAUSE = 0.25
MAX_PAUSE = 5.0
#: Seconds between two "still waiting" lines.
PROGRESS_EVERY = 60.0


def master_wait(env: Mapping[str, str]) -> float:
    """The wait in seconds: ``CLUSTERDDP_MASTER_WAIT`` when set (checked), else the default."""
    raw = env.get(MASTER_WAIT_ENV, "")
    if raw == "":
        return DEFAULT_MASTER_WAIT
    try:
        value = float(raw)
    except ValueError:
        raise LaunchError(f"{MASTER_WAIT_ENV}: expected a number of seconds, got {raw[:40]!r}") from None
    problem = seconds_problem(value)
    if problem:
        raise LaunchError(f"{MASTER_WAIT_ENV}: {problem}")
    return value


def wait_for_master(addr: str, port: int, timeout: float, say: Callable[[str], None],
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once ``addr`` resolves; raise LaunchError (exit 2) when ``timeout`` seconds pass
    without it. Any resolver failure counts as "not yet" (no record yet, resolver busy)."""
    start = clock()
    pause, next_line = FIRST_PAUSE, start
    while True:
        try:
            socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
        else:
            if next_line > start:
                say(f"clusterddp: master address {addr} resolves after {clock() - start:.0f} s")
            return
        waited = clock() - start
        if waited >= timeout:
            raise LaunchError(
                f"master address {addr} did not resolve within {timeout:g} s ({reason})",
                f"node 0's pod never came up, or the name is wrong; wait longer with {MASTER_WAIT_ENV}=SECONDS")
        if clock() >= next_line:
            say(f"clusterddp: waiting up to {timeout:g} s for master address {addr} to resolve "
                f"({reason}; node 0 may not be up yet)" if next_line == start else
                f"clusterddp: still waiting for master address {addr} ({reason}): {waited:.0f} of {timeout:g} s")
            next_line = clock() + PROGRESS_EVERY
        sleep(min(pause, max(0.0, timeout - waited)))
        pause = min(pause * 2, MAX_PAUSE)
