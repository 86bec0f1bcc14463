"""Whole-job restarts in place over SSH: the next attempt on the launchers that wait for it.

While the job has restarts left, the head starts every host's launcher with
``--await-restart``. A failure then ends the attempt on every host (``relay``: the end word)
instead of stopping the hosts; each launcher tears down its workers, reports (a result line
marked waiting) and waits with its zygote, the interpreter that has imported torch. When the
verdict says restart and every host of the attempt waits (none lost, its session alive) on
as many hosts as the job may have, the head keeps the sessions: no probe, no new connection,
no new launcher; it sends each the restart word with the next attempt's number and master
port, and each forks its workers at once. Otherwise (a host lost or its launcher gone, fewer
hosts than the job may use, a stop) the waiting launchers are released (EOF: they end) and the
next attempt starts as before, probed and launched anew.

Pure rules over what the relay left in each ``RemoteLauncher``; the head's loop is ``fanout``'s.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from clusterddp.launch.ssh import io
from clusterddp.launch.ssh.attempt import Launch, Start, master_port, plan_launchers, start_line
from clusterddp.launch.ssh.io import RemoteLauncher


def keepable(launch: Launch, launchers: Sequence[RemoteLauncher]) -> bool:
    """Can the next attempt run in place on these launchers? Every one waits for the head's
    word with its session alive, and no other host could join: a fixed node count, or an
    elastic job already at its most hosts (else the probe may find a spare worth taking)."""
    if not launchers or not all(io.waiting(lau) and io.alive(lau) for lau in launchers):
        return False
    return not launch.job.elastic or len(launchers) >= launch.high


def still_waiting(launchers: Sequence[RemoteLauncher]) -> bool:
    """Checked again just before the restart word: none of them ended meanwhile (killed, its
    link lost during the backoff)."""
    return all(io.alive(lau) for lau in launchers)


def in_place_start(launch: Launch, kept: Start, number: int) -> Start:
    """Attempt ``number`` on the kept hosts: the same node ranks, its own master port (derived
    per attempt as before, so nothing of the last attempt is in the way), no probe."""
    port = master_port(launch, number)
    plans = plan_launchers(launch, kept.sessions, kept.master_addr, port, number)
    world = sum(p.nproc for p in plans)
    launch.console.say(start_line(number, [p.host for p in plans], world, kept.left_out)
                       + "; in place (the same launchers)")
    return Start(kept.sessions, plans, kept.master_addr, port, kept.left_out)


def keep_alive(launchers: Sequence[RemoteLauncher], seconds: float, stopped: Callable[[], bool],
               interval: float) -> bool:
    """Wait ``seconds`` (a restart's backoff) with a heartbeat to every waiting launcher, so
    none stops for a silent head; True when a stop signal came meanwhile (at once)."""
    deadline = time.monotonic() + seconds
    next_beat = time.monotonic()
    while not stopped():
        now = time.monotonic()
        if now >= deadline:
            return False
        if now >= next_beat:
            io.heartbeat(launchers)
            next_beat = now + interval
        time.sleep(min(0.1, deadline - now, max(0.0, next_beat - now)) or 0.01)
    return True
