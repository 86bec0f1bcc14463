"""How a fan-out run ended, from what the head knows of each host, and the report that says so:
pure functions over plain data.

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

``format_outcome`` is the head's closing report: which host failed first, and what became of
every host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

from clusterddp import exitcodes
from clusterddp.launch.observe.logs import visible_text
from clusterddp.launch.restart.verdict import Failure, RankEnd, failure_of

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
    #: Reported for this attempt: its session ended, or it waits for the head's word.
    done: bool = False
    #: The head told this launcher to stop or to end the attempt (EOF, or the end word) before
    #: it failed: what it does next is a consequence, not a cause.
    eof_sent: bool = False
    #: Where the host is and its node rank, for the report.
    address: str = ""
    node_rank: int = 0

    @property
    def exit_code(self) -> int | None:
        return host_exit_code(self.result, self.exit_status, self.lost)

    def failed(self) -> bool:
        code = self.exit_code
        return code is not None and code != 0

    @property
    def waits(self) -> bool:
        """Its result line says that its launcher outlives the failed attempt and waits for
        the head's word (``--await-restart``): restart in place, or end."""
        return bool((self.result or {}).get("waiting"))


H = TypeVar("H", bound=HostState)


@dataclass
class Outcome:
    """How the run ended: exit code, the host blamed first, and why the head stopped it."""

    exit_code: int
    root: HostState | None
    stop_reason: str | None
    launchers: Sequence[HostState]
    seconds: float
    #: When the head began stopping the hosts (monotonic), if it had to.
    stop_began: float | None = None


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


def attempt_failure(outcome: Outcome) -> str | None:
    """``cdssh4: connection lost (...)``, the first failure of an attempt, for its report line."""
    if outcome.root is not None:
        return f"{outcome.root.name}: {host_failure(outcome.root)}"
    if outcome.exit_code != 0:
        return outcome.stop_reason or "a host failed"
    return None


def verdict_failure(outcome: Outcome) -> Failure | None:
    """The attempt's first failure as the restart verdict reads it (``launch/restart/verdict.py``):
    the root host's failed worker (exit, signal, traceback, from its result line), a hang, or
    a lost host; None when nothing failed, or the failure was a launcher's own and not a
    worker's (it is restarted as before: nothing says it will repeat)."""
    if outcome.exit_code == 0:
        return None
    if outcome.exit_code == exitcodes.HANG:
        return Failure(exitcodes.HANG, hang=True)
    root = outcome.root
    if root is None:
        return None
    if root.lost:
        return Failure(HOST_LOST, message=root.lost)
    cause = (root.result or {}).get("root_cause")
    if not cause or cause.get("stopped_by_us"):
        return None
    tail = cause.get("tail")
    code = cause.get("exit_code")
    return failure_of(code if isinstance(code, int) else root.exit_code or 1,
                      cause.get("signal") if isinstance(cause.get("signal"), str) else None,
                      [str(line) for line in tail] if isinstance(tail, list) else [])


def rank_ends(hosts: Sequence[HostState]) -> list[RankEnd]:
    """How every rank of the job ended, as each host's launcher said in its result line (a
    host that said nothing, lost or cut off, adds nothing: its ranks are not known)."""
    ends: list[RankEnd] = []
    for host in hosts:
        said = host.result.get("ranks") if host.result is not None else None
        if isinstance(said, list):
            ends += [end for end in map(RankEnd.from_json, said) if end is not None]
    return ends


def progressed(hosts: Sequence[HostState]) -> bool:
    """Did any rank of the job complete a step in the attempt, as the hosts' launchers saw it
    in their ranks' progress files? Unknown (no host said, e.g. all lost) counts as yes,
    so such an attempt is restarted as before."""
    said = [host.result.get("progressed") for host in hosts if host.result is not None]
    known = [value for value in said if isinstance(value, bool)]
    return any(known) or not known


def format_outcome(job_name: str, outcome: Outcome) -> str:
    """Root cause first (host, node rank, rank, exit, log, last lines), then one line per host."""
    root = outcome.root
    lines: list[str] = []
    if root is not None:
        lines.append(f"clusterddp: job '{job_name}' failed on {root.name}: {host_failure(root)}")
        lines.append("  root cause (first failure across hosts):")
        lines.append(f"    host:       {root.name} ({root.address}), node rank {root.node_rank}")
        cause = (root.result or {}).get("root_cause")
        if cause:
            exit_text = f"killed by {cause['signal']}" if cause.get("signal") else f"exit code {cause.get('exit_code')}"
            lines.append(f"    rank:       {cause.get('rank')} (local rank {cause.get('local_rank')}), "
                         f"pid {cause.get('pid')}")
            lines.append(f"    exit:       {exit_text}")
            lines.append(f"    log:        {cause.get('log')} (on {root.name})")
            if cause.get("tail"):
                lines.append("    last lines:")
                # A worker's own words, as the host's report shows them (the head's Console masks).
                lines.extend(f"      {visible_text(str(line))}" for line in cause["tail"])
        if outcome.exit_code == exitcodes.HANG and outcome.stop_reason:
            lines.append(f"    verdict:    {outcome.stop_reason}")
    elif outcome.exit_code != 0:
        lines.append(f"clusterddp: job '{job_name}' stopped: {outcome.stop_reason or 'a host failed'}")
    else:
        return ""
    lines.append("  hosts:")
    for launcher in outcome.launchers:
        lines.append(f"    {launcher.name:<16} node {launcher.node_rank:<3} {_state(launcher)}")
    return "\n".join(lines)


def host_failure(launcher: HostState) -> str:
    """Why a host counts as failed: its lost link, its first rank's exit, or its launcher's."""
    if launcher.lost:
        return launcher.lost
    cause = (launcher.result or {}).get("root_cause")
    if cause:
        outcome = f"killed by {cause['signal']}" if cause.get("signal") else f"exit code {cause.get('exit_code')}"
        return f"rank {cause.get('rank')} {outcome}"
    reason = (launcher.result or {}).get("reason")
    if launcher.exit_code is None:
        return reason or "still stopping"
    if launcher.result is None and launcher.exit_status == -1:
        return "the launcher died without an exit status (killed by a signal?), its host still answering"
    return f"launcher exit code {launcher.exit_code}" + (f" ({reason})" if reason else "")


def _state(launcher: HostState) -> str:
    if launcher.lost:
        return launcher.lost
    if not launcher.done:
        return "did not report back (stopped by process-group kill or unreachable)"
    code = launcher.exit_code
    if code == 0:
        return "finished (exit 0)"
    cause = (launcher.result or {}).get("root_cause")
    if launcher.eof_sent and not (cause and not cause.get("stopped_by_us")):
        return f"stopped by clusterddp (exit {code})"
    return f"failed: {host_failure(launcher)}"
