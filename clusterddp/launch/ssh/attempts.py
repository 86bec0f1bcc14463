"""Restarts of the whole job across hosts: which hosts the next attempt runs on, whether
there is a next attempt, and the lines that tell the user. Pure functions over plain data.

The head owns restarts of a fan-out (``restarts: N``): any failure (a rank's non-zero exit, a
lost host, a hang) stops every host as before, then the whole job starts again on every
host with the same run id and ``--restart-count K`` (TORCHELASTIC_RESTART_COUNT=K). No host
ever restarts its own group alone: its peers would not come back with it.

With ``nodes: "MIN:MAX"`` the hostfile may list spares. Before every attempt each candidate
is probed; hosts that are unreachable or fail preflight are left out, and so is a host whose
connection was lost in the last attempt (a dead node: probing it again would only wait out
the connect timeout). A host whose launcher died while its sshd still answers is tried again:
the node is fine. The first MAX healthy hosts in hostfile order run the attempt; fewer than
MIN ends the job, naming every host left out and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Sequence, TypeVar

from clusterddp.exitcodes import NOT_RESTARTED
from clusterddp.launch.restart import backoff_seconds

S = TypeVar("S")


@dataclass(frozen=True)
class Attempt:
    """One start of the whole job, as the final report lists it."""

    #: 0 for the first start; TORCHELASTIC_RESTART_COUNT of its workers.
    number: int
    hosts: tuple[str, ...]
    world_size: int
    exit_code: int
    #: ``cdssh4: connection lost (...)``: the first failure, if any.
    failure: str | None
    seconds: float

    def line(self) -> str:
        """``attempt 1: 4 hosts (world size 4) cdssh1,...: exit 255 after 12.3s, cdssh4: ...``"""
        how = "finished" if self.exit_code == 0 else f"exit {self.exit_code}"
        hosts = ",".join(self.hosts) if len(self.hosts) <= 8 else f"{','.join(self.hosts[:8])},..."
        text = (f"attempt {self.number + 1}: {len(self.hosts)} host(s) (world size {self.world_size}) {hosts}: "
                f"{how} after {self.seconds:.1f}s")
        return text + (f"; first failure {self.failure}" if self.failure else "")


@dataclass
class Selection(Generic[S]):
    """The hosts an attempt runs on, and every candidate left out with the reason."""

    chosen: list[S] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)


def choose_hosts(candidates: Sequence[tuple[str, S, Sequence[str]]], high: int) -> Selection[S]:
    """The first ``high`` healthy candidates in order; ``candidates`` are (name, session,
    problems). The others are left out with their problems (or as spares)."""
    selection: Selection[S] = Selection()
    for name, session, problems in candidates:
        if problems:
            selection.left_out.append((name, "; ".join(problems)))
        elif len(selection.chosen) < high:
            selection.chosen.append(session)
        else:
            selection.left_out.append((name, f"spare (nodes: at most {high})"))
    return selection


def too_few(ready: int, low: int, high: int) -> str | None:
    """Why an attempt cannot start with ``ready`` hosts (None: it can)."""
    if ready >= low:
        return None
    need = f"{low}" if low == high else f"at least {low} (nodes: {low}:{high})"
    return f"{ready} host(s) ready, the job needs {need}"


def next_backoff(attempts: Sequence[Attempt], restarts: int, stopping: bool) -> float | None:
    """Seconds to wait before the next attempt, or None when the last one ends the job: it
    succeeded, the head was told to stop, the restarts are used up, or its exit is one a
    restart cannot fix (75: preempted, the scheduler's business; 65: non-finite loss)."""
    last = attempts[-1]
    if last.exit_code == 0 or stopping or last.number >= restarts or last.exit_code in NOT_RESTARTED:
        return None
    return backoff_seconds(last.number)


def restart_line(last: Attempt, restarts: int, backoff: float, dead: dict[str, str]) -> str:
    """The one line a restart prints: which attempt failed and why, what comes next."""
    text = (f"attempt {last.number + 1} failed ({last.failure or f'exit {last.exit_code}'}); "
            f"restarting the whole job in {backoff:.0f}s (restart {last.number + 1} of {restarts})")
    if dead:
        text += "; left out: " + ", ".join(f"{name} ({why})" for name, why in dead.items())
    return text


def start_line(number: int, hosts: Sequence[str], world_size: int, left_out: Sequence[tuple[str, str]]) -> str:
    """The line a restarted attempt prints once its hosts are chosen."""
    text = f"restart {number}: {len(hosts)} host(s) {','.join(hosts)} (world size {world_size})"
    if left_out:
        text += "; not used: " + "; ".join(f"{name}: {why}" for name, why in left_out)
    return text
