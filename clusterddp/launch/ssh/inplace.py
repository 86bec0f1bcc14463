"""Whole-job restarts in place over SSH: the next attempt on the launchers that wait for it.

While the job has restarts left, the head starts every host's launcher with
``--await-restart``. A failure then ends the attempt on every host (``relay``: the end word)
instead of stopping the hosts; each launcher tears down its workers, reports (a result line
marked waiting) and waits with its zygote, the interpreter that has imported torch. When the
verdict says restart and every host of the attempt waits (none lost, its session alive) on
as many hosts as the job may have, the head keeps the sessions: no probe, no new connection,
no new launcher; it sends each the restart word with the next attempt's number and master
port, and each forks its workers at once. An elastic job that lost hosts (their link) and
has no other host to take runs on those left the same way, each told its new node rank and
every node's workers in the word (and the master's new address, when node 0 went). Otherwise (a launcher gone on a live host, a spare that a
probe could take, a stop) the waiting launchers are released (EOF: they end) and the next
attempt starts as before, probed and launched anew.

Pure rules over what the relay left in each ``RemoteLauncher``; the head's loop is ``fanout``'s.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from clusterddp.launch.ssh import io
from clusterddp.launch.ssh.attempt import Launch, Start, address_of, master_port, plan_launchers, start_line
from clusterddp.launch.ssh.io import RemoteLauncher
from clusterddp.launch.ssh.reach import HostSession


def keepable(launch: Launch, launchers: Sequence[RemoteLauncher]) -> list[RemoteLauncher] | None:
    """The launchers the next attempt can run on in place, or None (probe and launch anew).

    Every one of them, when all wait for the head's word with their session alive and no
    other host could join: a fixed node count, or an elastic job already at its most hosts
    (else the probe may find a spare worth taking). Those left, when some hosts were lost
    (their link) and the job is elastic: if they are at least MIN, the attempt ran on every
    listed host (no spare, and none left out that a probe might find back) and either node 0
    is among them (the master stays: the hosts' routes to it were probed) or the next node 0
    is on the network the job used (``new_master``). A launcher that ended on its own, on a
    host whose link is fine, is launched anew with the others."""
    if not launchers:
        return None
    left = [lau for lau in launchers if io.waiting(lau) and io.alive(lau)]
    if len(left) == len(launchers):
        return left if not launch.job.elastic or len(left) >= launch.high else None
    gone = [lau for lau in launchers if lau not in left]
    if not launch.job.elastic or not left or any(not lau.lost for lau in gone):
        return None
    if len(left) < launch.low or len(launchers) < len(launch.hosts):
        return None
    if launch.master_addr is not None or left[0] is launchers[0]:
        return left
    return left if new_master(left[0].session) is not None else None


def new_master(session: HostSession) -> str | None:
    """The master's address when node 0 was lost and ``session``'s host becomes node 0: its
    address as the head resolves it for a launch, when that is the address its own route to
    the old master left from. The job's network then already carries it, on the interface the
    hosts' launchers were given (``GLOO_SOCKET_IFNAME``, from their routes to the old master);
    None: only a probe can tell (each host's route to it), so the restart probes anew."""
    address = address_of(session.host)
    route = session.facts.get("route") or {}
    return address if address is not None and address == route.get("src") else None


def still_waiting(launchers: Sequence[RemoteLauncher]) -> bool:
    """Checked again just before the restart word: none of them ended meanwhile (killed, its
    link lost during the backoff)."""
    return all(io.alive(lau) for lau in launchers)


def in_place_start(launch: Launch, kept: Start, number: int, lost: dict[str, str]) -> Start:
    """Attempt ``number`` on the kept launchers (``fanout``'s kept start): its own master port
    (derived per attempt as before, so nothing of the last attempt is in the way), no probe.
    When hosts were lost (``lost``), the others are numbered again in their order, the master
    moving to the new node 0 if node 0 went (``new_master``), and each is told its new place
    with the restart word: world size, ranks and logs follow."""
    sessions, renumbered = kept.sessions, kept.renumbered
    master = kept.master_addr
    if renumbered and sessions[0].node_rank != 0 and launch.master_addr is None:
        master = new_master(sessions[0]) or master  # node 0 went: keepable checked the new one
    for node_rank, session in enumerate(sessions):
        if session.launched_as is None:
            session.launched_as = session.node_rank
        session.node_rank = node_rank
    port = master_port(launch, number)
    plans = plan_launchers(launch, sessions, master, port, number)
    world = sum(p.nproc for p in plans)
    left_out = [*kept.left_out, *lost.items()]
    how = (", numbered again" if renumbered else "") + (f", master {master}" if master != kept.master_addr else "")
    launch.console.say(start_line(number, [p.host for p in plans], world, left_out)
                       + f"; in place (the same launchers{how})")
    return Start(sessions, plans, master, port, left_out, renumbered=renumbered,
                 master_moved=master != kept.master_addr)


def keep_alive(launchers: Sequence[RemoteLauncher], seconds: float, stopped: Callable[[], bool],
               interval: float) -> bool:
    """Wait ``seconds`` (a restart's backoff) with a keepalive to every waiting launcher, so
    none stops for a silent head; True when a stop signal came meanwhile (at once)."""
    deadline = time.monotonic() + seconds
    next_beat = time.monotonic()
    while not stopped():
        now = time.monotonic()
        if now >= deadline:
            return False
        if now >= next_beat:
            io.keepalive(launchers)
            next_beat = now + interval
        time.sleep(min(0.1, deadline - now, max(0.0, next_beat - now)) or 0.01)
    return True
