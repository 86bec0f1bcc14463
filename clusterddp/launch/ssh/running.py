"""The head's two states that act on the hosts (``fanout.HeadState``): RUNNING, one attempt
on its hosts (each host's log, GO or the restart word to every one at once, relayed to the end,
their event logs gathered, its failure reported), and RELEASING, the launchers that wait for a
word that will not come ended; and ``Stop``, the head's stop signals, which reach the relay
that runs.
"""

from __future__ import annotations

import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from clusterddp.launch.ssh import io
from clusterddp.launch.ssh.attempt import Launch, Start
from clusterddp.launch.ssh.headlog import Gatherer, HeadLog
from clusterddp.launch.ssh.io import HostLog, RemoteLauncher, restart_hosts, start_hosts
from clusterddp.launch.ssh.outcome import Outcome, format_outcome
from clusterddp.launch.ssh.relay import Relay
from clusterddp.protocol import STACKS_REQUEST_SIGNAL, STOP_SIGNALS, restart_marker, write_launcher_file


@dataclass
class Stop:
    """The head's stop signals: forwarded to the relay running, remembered for the loop (a
    signal that arrives before the relay exists is acted on at once)."""

    relay: Relay | None = None
    signum: int | None = None
    previous: dict[int, Any] = field(default_factory=dict)

    def __call__(self, signum: int, frame: object) -> None:
        self.signum = self.signum or signum
        if self.relay is not None:
            self.relay.request_stop(f"{signal.Signals(signum).name} on the head", signum)

    def stacks(self, signum: int, frame: object) -> None:
        """``clusterddp stacks`` asks the head; before the relay runs there is nothing to ask."""
        if self.relay is not None:
            self.relay.request_stacks()

    def install(self) -> None:
        """The stop signals and ``clusterddp stacks``' signal come here (in the main thread)."""
        for signum in STOP_SIGNALS:
            try:
                self.previous[signum] = signal.signal(signum, self)
            except ValueError:  # not the main thread: the caller handles signals
                return
        self.previous[STACKS_REQUEST_SIGNAL] = signal.signal(STACKS_REQUEST_SIGNAL, self.stacks)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def run_attempt(launch: Launch, start: Start, number: int, stop: Stop, gatherer: Gatherer, log: HeadLog,
                in_place: bool = False) -> Outcome:
    """One attempt, step by step: each chosen host's log opened, GO to every host at once (or,
    ``in_place``, the restart word to every waiting launcher), relay until the end, the hosts'
    event logs gathered, report its failure."""
    log_dir = Path(launch.job.logs.dir) / launch.run_id
    launchers = _launchers(launch, start, number, log_dir)
    try:
        if in_place:
            restart_hosts(launchers, number, start.master_port, start.renumbered,
                          start.master_addr if start.master_moved else None)
        else:
            start_hosts(launchers)
        gatherer.look(launchers)
        outcome = _relay(launch, launchers, log_dir, stop, log,
                         in_place=number if number < launch.job.restarts else None)
        gatherer.gather(launchers)
    finally:
        for launcher in launchers:
            launcher.log.close()
    report = format_outcome(launch.job.name, outcome)
    if report:
        launch.console.write_err(report + f"\n  head's copy of each host's output: {log_dir}/ssh-<host>.log\n")
    return outcome


def _launchers(launch: Launch, start: Start, number: int, log_dir: Path) -> list[RemoteLauncher]:
    """Every chosen host as the head follows it, each with the head's copy of its output (a
    restart marker first on a restart), and the run's launcher.json, before any host starts."""
    log_dir.mkdir(parents=True, exist_ok=True)
    launchers = [RemoteLauncher(session=s, plan=p, log=HostLog(str(log_dir / f"ssh-{s.host.name}.log"),
                                                               launch.console))
                 for s, p in zip(start.sessions, start.plans)]
    if number:
        for launcher in launchers:
            launcher.log.write(restart_marker(number))
    write_launcher_file(log_dir, socket.gethostname(), launch.run_id,
                        list(range(sum(p.nproc for p in start.plans))), hosts=[p.host for p in start.plans])
    return launchers


def _relay(launch: Launch, launchers: list[RemoteLauncher], log_dir: Path, stop: Stop, log: HeadLog,
           in_place: int | None) -> Outcome:
    """Relay the started hosts until the end; a stop signal that came before is acted on at once.
    ``in_place``: the attempt, when a failure only ends it (the hosts wait for the next)."""
    relay = Relay(launchers, launch.console, launch.settings, grace_period=launch.job.grace_period,
                  keepalive_interval=launch.keepalive_interval, log_dir=log_dir, events=log.events,
                  in_place=in_place)
    if launch.job.logs.merge and launch.job.logs.prefix:
        world = sum(launcher.plan.nproc for launcher in launchers)
        shown = launch.job.logs.ranks
        launch.console.merging(world if shown is None else len({rank for rank in shown if rank < world}))
    stop.relay = relay
    if stop.signum is not None:
        relay.request_stop(f"{signal.Signals(stop.signum).name} on the head", stop.signum)
    try:
        return relay.run()
    finally:
        stop.relay = None


def release_launchers(launch: Launch, start: Start, signum: int | None, gatherer: Gatherer,
                      launchers: Sequence[RemoteLauncher] | None = None) -> list[RemoteLauncher]:
    """End the launchers that wait for a restart word that will not come (the job ends, or the
    next attempt starts anew): EOF (after the stop byte, if the head got a signal), then relay
    their last lines until their sessions end, as a stop does; their event logs gathered.
    ``launchers``: those of the attempt just run, of which only the waiting ones are released."""
    sessions = [lau.session for lau in launchers if io.waiting(lau)] if launchers is not None else start.sessions
    if not sessions:
        return []
    log_dir = Path(launch.job.logs.dir) / launch.run_id
    plans = {plan.host: plan for plan in start.plans}
    ending = [RemoteLauncher(session=s, plan=plans[s.host.name],
                             log=HostLog(str(log_dir / f"ssh-{s.host.name}.log"), launch.console)) for s in sessions]
    try:
        relay = Relay(ending, launch.console, launch.settings, grace_period=launch.job.grace_period,
                      keepalive_interval=launch.keepalive_interval)
        relay.request_stop("the job ends" if signum is None else f"{signal.Signals(signum).name} on the head",
                           signum)
        relay.run()
        gatherer.gather(ending)
    finally:
        for launcher in ending:
            launcher.log.close()
    return ending
