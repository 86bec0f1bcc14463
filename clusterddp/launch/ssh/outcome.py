"""How a fan-out run ended, from what the head knows of each host: pure functions over plain data.

``HostState`` is that knowledge (the launcher's result line, the SSH exit status, a lost
link, when the host failed, whether the head had already told it to stop); nothing here
reads a channel or a clock, so every rule is tested with plain values (tests/ssh/test_outcome.py).

The rules, in order:

- a hang wins: whatever failed after it (peers of the stopped ranks lose their connections)
  is a consequence, and ``exitcodes.HANG`` is the job's exit code;
- otherwise the root cause is the host that failed first, by the time each failure happened
  (``root_cause``), and its exit code is the job's;
- otherwise a signal to the head gives ``128 + signal``;
- otherwise any failed host, or a host that never reported back, fails the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

from clusterddp import exitcodes

#: Exit code when a host is lost (ssh's own convention for connection errors).
HOST_LOST = 255


@dataclass(eq=False)
class HostState:
    """What the head knows about one host's launcher (plain data: no channel, no clock)."""

    name: str
    #: The launcher's result line (``protocol.parse_result``), once it arrived.
    result: dict[str, Any] | None = None
    #: The SSH exit status of the launcher's session (-1: none came).
    exit_status: int | None = None
    #: Why the connection counts as lost, if it does.
    lost: str | None = None
    #: Wall-clock time of this host's failure as far as the head can tell.
    failed_at: float | None = None
    done: bool = False
    #: The head closed this launcher's stdin: what it does next is a consequence, not a cause.
    eof_sent: bool = False

    @property
    def exit_code(self) -> int | None:
        return host_exit_code(self.result, self.exit_status, self.lost)

    def failed(self) -> bool:
        code = self.exit_code
        return code is not None and code != 0


H = TypeVar("H", bound=HostState)


def host_exit_code(result: dict[str, Any] | None, exit_status: int | None, lost: str | None) -> int | None:
    """One host's exit code: lost -> ``HOST_LOST``; else its result line's; else its SSH exit
    status (a negative one, no status from sshd, counts as lost); None while it runs."""
    if lost:
        return HOST_LOST
    if result is not None:
        return int(result.get("exit_code", 1))
    if exit_status is not None:
        return exit_status if exit_status >= 0 else HOST_LOST
    return None


def unhandled_failure(hosts: Sequence[H]) -> H | None:
    """The first host that failed before the head told it to stop: the job must stop."""
    return next((host for host in hosts if host.failed() and not host.eof_sent), None)


def failure_reason(host: HostState) -> str:
    """Why the head stops every host when ``host`` failed: ``node3 failed (exit code 3)``."""
    what = host.lost or f"exit code {host.exit_code}"
    return f"{host.name} failed ({what})"


def root_cause(hosts: Sequence[H], now: float) -> H | None:
    """The host that failed first, by the time each failure happened.

    A worker's failure carries its own wall-clock time (``root_cause.at``, hosts' clocks
    are assumed NTP-close); a lost host counts from when its link stopped acknowledging.
    Hosts the head was already stopping are not causes: their exits are consequences.
    ``now`` stands in for a failure whose time the head never learnt.
    """
    candidates: list[tuple[float, H]] = []
    for host in hosts:
        if not host.failed():
            continue
        cause = (host.result or {}).get("root_cause")
        if cause and not cause.get("stopped_by_us"):
            candidates.append((float(cause.get("at") or host.failed_at or 0.0), host))
        elif not host.eof_sent or host.lost:
            candidates.append((host.failed_at or now, host))
    if not candidates:
        return None
    return min(candidates, key=lambda c: c[0])[1]


def job_result(hosts: Sequence[H], hang: H | None, stop_signal: int | None, now: float) -> tuple[int, H | None]:
    """The job's exit code and the host blamed first (see the module docstring for the order)."""
    if hang is not None:
        return exitcodes.HANG, hang
    root = root_cause(hosts, now)
    if root is not None:
        code = root.exit_code or 1
    elif stop_signal is not None:
        code = 128 + stop_signal
    elif any(host.failed() or not host.done for host in hosts):
        code = next((host.exit_code for host in hosts if host.failed()), None) or 1
    else:
        code = 0
    return code, root
