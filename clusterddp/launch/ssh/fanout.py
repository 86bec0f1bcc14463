"""``clusterddp run JOB --hostfile F``: the same launcher on every host, supervised from here.

Steps: hosts (hostfile + ssh_config) -> per attempt (``attempt``): connect and probe every
candidate in parallel, preflight (all problems at once, nothing started), choose the hosts,
one ``LaunchPlan`` per host -> GO to every stub at once -> relay output and heartbeats until
the end -> report naming the host that failed first -> with ``restarts: N``, the whole job
again (``attempt`` holds the rules). docs/ssh.md is the user's guide to all of it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from clusterddp.errors import RemoteError
from clusterddp.hostfile import HostEntry, entries_from_list, read_hostfile, select_hosts
from clusterddp.launch.supervise import runlock
from clusterddp.launch.flags import remote_args
from clusterddp.launch.options import RunOptions
from clusterddp.launch.ssh.attempt import (Attempt, FanoutOptions, Launch, Start, dry_run_text, forwarded_env,
                                           heartbeat_interval, next_backoff, prepare, refuse_loopback,
                                           restart_line)
from clusterddp.launch.ssh.gather import Gatherer
from clusterddp.launch.ssh.headlog import HeadLog
from clusterddp.launch.ssh.hosts import Host, load_ssh_config, resolve_hosts
from clusterddp.launch.ssh import inplace, io
from clusterddp.launch.ssh.io import Console, RemoteLauncher, restart_hosts, start_hosts
from clusterddp.launch.ssh.outcome import HostState, Outcome, attempt_failure, format_outcome
from clusterddp.launch.ssh.reach import ConnectSettings, PreflightError
from clusterddp.launch.ssh.relay import Relay
from clusterddp.protocol import STACKS_REQUEST_SIGNAL, STOP_SIGNALS, restart_marker, write_launcher_file
from clusterddp.redact import passthrough_env
from clusterddp.spec import JobSpec
from clusterddp.topology import default_run_id

__all__ = ["FanoutOptions", "fanout_options", "head_launch_env", "run_fanout"]

FDS_PER_HOST = 5


@dataclass
class _Stop:
    """Signals that arrive before the relay exists are remembered and acted on at once."""

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


def run_fanout(job: JobSpec, options: FanoutOptions) -> int:
    """Run ``job`` on every host (restarting the whole job up to ``restarts`` times); return the
    exit code (0, or the first failure's of the last attempt)."""
    console = Console(options.stdout or sys.stdout.buffer, options.stderr or sys.stderr.buffer)
    entries = _entries(job, options)
    ssh = replace(job.ssh, config_file=_job_path(job, job.ssh.config_file),
                  known_hosts=_job_path(job, job.ssh.known_hosts),
                  identity_file=_job_path(job, job.ssh.identity_file))
    hosts = resolve_hosts(entries, ssh, load_ssh_config(ssh.config_file, dry_run=options.dry_run))
    low, high = _node_bounds(job, hosts)
    settings = ConnectSettings(timeout=job.ssh.connect_timeout, accept_new_host_keys=job.ssh.accept_new_host_keys,
                               link_timeout=job.ssh.link_timeout)
    run_id = options.run_id or default_run_id(job.name)  # handed to every host: unique
    master_addr = options.master_addr or job.master.addr
    refuse_loopback(master_addr, min(high, len(hosts)))  # before any connection: the user's address
    head_env = dict(os.environ if options.head_env is None else options.head_env)
    target, paths = _target(job, options)
    launch = Launch(job=job, options=options, hosts=hosts, settings=settings, run_id=run_id,
                     master_addr=master_addr, python=job.python or sys.executable, cwd=options.cwd or os.getcwd(),
                     base_env=head_launch_env(job, head_env), target=target, paths=paths, low=low, high=high,
                     console=console, heartbeat_interval=heartbeat_interval(options.heartbeat_interval,
                                                                             settings.link_timeout))
    _raise_fd_limit(len(hosts), console)
    nodes = f", nodes {low}:{high} of {len(hosts)} listed" if job.elastic else ""
    console.say(f"{len(hosts)} hosts{nodes}, run id {run_id}; host keys: {settings.policy_name}")
    stop = _Stop()
    _install(stop)
    head_lock = runlock.RankLocks()
    log = HeadLog(job)
    try:
        code = _attempts(launch, stop, head_lock, log)
        log.close(code)
        return code
    finally:
        log.close(None)
        _restore(stop)
        head_lock.release()


def _node_bounds(job: JobSpec, hosts: Sequence[Host]) -> tuple[int, int]:
    """(MIN, MAX) hosts per attempt: the job's ``nodes: "MIN:MAX"``, else every listed host."""
    if not job.elastic:
        return len(hosts), len(hosts)
    low, high = job.node_range
    if len(hosts) < low:
        raise RemoteError(f"{job.where('nodes')}: {job.nodes!r} needs at least {low} hosts, "
                          f"{len(hosts)} listed", "list more hosts (spares welcome), or lower MIN")
    return low, high


def _attempts(launch: Launch, stop: _Stop, head_lock: runlock.RankLocks, log: HeadLog) -> int:
    """Start the job, and start it again after a failure while restarts are left, unless the
    failure will repeat (``HeadLog.judge``: the verdict a launcher alone applies). A restart
    runs in place on the launchers that wait for it when it can (``inplace``), else it probes
    and launches anew.

    ``head_lock`` takes the run's head lock once the first preflight passed, before any host
    starts: a second job with this run id would overwrite launcher.json and append to the
    first's ssh-<host>.log (its hosts would refuse it too, later and once per host)."""
    run_dir = Path(launch.job.logs.dir) / launch.run_id
    gatherer = Gatherer(os.path.join(launch.cwd, launch.job.logs.dir, launch.run_id), run_dir, launch.console,
                        launch.settings.timeout)
    loop = _Attempts(launch, stop, head_lock, log, gatherer, run_dir)
    while True:
        try:
            loop.next()
        except _JobEnds as ends:
            return ends.code


class _JobEnds(Exception):
    """The job ends with ``code``, at whatever step of an attempt found it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class _Attempts:
    """The head's attempts, one ``next`` each: what carries from one to the next."""

    launch: Launch
    stop: _Stop
    head_lock: runlock.RankLocks
    log: HeadLog
    gatherer: Gatherer
    run_dir: Path
    attempts: list[Attempt] = field(default_factory=list)
    #: Hosts whose connection was lost in the last attempt (an elastic job leaves them out).
    dead: dict[str, str] = field(default_factory=dict)
    #: The last attempt's hosts, when their launchers wait for the restart word.
    kept: tuple[Start, list[RemoteLauncher]] | None = None

    def next(self) -> None:
        """One attempt and the wait after it; raises ``_JobEnds`` when the job ends."""
        launch, stop, number = self.launch, self.stop, len(self.attempts)
        held = list(self.kept[0].sessions) if self.kept else []  # closed unless kept again
        kept: list[RemoteLauncher] | None = None
        try:
            start, in_place = self._start(number)
            held = list(start.sessions)
            if stop.signum is not None:
                launch.console.say(f"{signal.Signals(stop.signum).name} during preflight: nothing was started")
                if in_place:
                    _release(launch, start, stop.signum, self.gatherer)
                raise _JobEnds(128 + stop.signum if not self.attempts else _finish(self.attempts, launch.console))
            outcome = self._run(start, number, in_place)
            backoff = _restart_backoff(launch, self.attempts, outcome, stop, self.log)
            waiting = [lau for lau in outcome.launchers if isinstance(lau, RemoteLauncher)]
            kept = inplace.keepable(launch, waiting) if backoff is not None and stop.signum is None else None
            released = [] if kept else _release(launch, start, stop.signum, self.gatherer, waiting)
        finally:
            for session in held:
                if not kept or all(session is not lau.session for lau in kept):
                    session.close()
        self.kept = (_kept_start(start, kept), kept) if kept else None
        if backoff is None:
            raise _JobEnds(_finish(self.attempts, launch.console))
        self.dead = _lost([*outcome.launchers, *released], launch.job.elastic, number + 1)
        launch.console.say(restart_line(self.attempts[-1], launch.job.restarts, backoff, self.dead))
        # The backoff counts from the failure: stopping the other hosts was part of it.
        stopping = time.monotonic() - outcome.stop_began if outcome.stop_began is not None else 0.0
        if inplace.keep_alive(kept or [], backoff - stopping, lambda: stop.signum is not None,
                              launch.heartbeat_interval):
            self._stopped_before_restart()

    def _start(self, number: int) -> tuple[Start, bool]:
        """Attempt ``number``'s hosts, and whether it runs in place: on the kept launchers while
        they all still wait, else probed anew (those still waiting released first)."""
        launch, kept = self.launch, self.kept
        self.kept = None
        if kept is not None and not inplace.still_waiting(kept[1]):
            ended = _release_kept(launch, kept[0], self.stop.signum, self.gatherer)  # one ended meanwhile
            self.dead, kept = _lost(ended, launch.job.elastic, number), None
        if kept is not None:
            return inplace.in_place_start(launch, kept[0], number, self.dead), True
        try:
            start = prepare(launch, number, self.dead)
        except PreflightError as exc:
            if not self.attempts:
                raise
            launch.console.say(f"restart {number}: {exc}")
            for detail in exc.details:
                launch.console.say(f"  {detail}")
            raise _JobEnds(_finish(self.attempts, launch.console)) from None
        if launch.options.dry_run:
            launch.console.write_out(dry_run_text(launch.job, start.plans, start.sessions, start.master_addr,
                                                  start.master_port, launch.run_id))
            for session in start.sessions:
                session.close()
            raise _JobEnds(0)
        return start, False

    def _run(self, start: Start, number: int, in_place: bool) -> Outcome:
        """The attempt from the head lock to its record in ``attempts``."""
        launch = self.launch
        if not self.head_lock.fds:
            self.head_lock.fds = runlock.lock_head(str(self.run_dir), launch.job.where("logs.dir"), launch.run_id).fds
        hosts = [p.host for p in start.plans]
        world = sum(p.nproc for p in start.plans)
        self.log.open(str(self.run_dir), hosts)
        self.log.attempt_started(number, hosts, world)
        began = time.monotonic()
        outcome = _run(launch, start, number, self.stop, self.gatherer, self.log, in_place=in_place)
        self.attempts.append(Attempt(number=number, hosts=tuple(hosts), world_size=world,
                                     exit_code=outcome.exit_code, failure=attempt_failure(outcome),
                                     seconds=time.monotonic() - began))
        return outcome

    def _stopped_before_restart(self) -> None:
        """A stop signal during the backoff: the waiting launchers released, the job's end."""
        signum = self.stop.signum or signal.SIGTERM
        self.launch.console.say(f"{signal.Signals(signum).name} before the restart: not restarting")
        self.log.emit("stop", why=f"{signal.Signals(signum).name} on the head before the restart")
        kept, self.kept = self.kept, None
        if kept:
            _release_kept(self.launch, kept[0], signum, self.gatherer)
        _finish(self.attempts, self.launch.console)
        raise _JobEnds(128 + signum)  # a stop is the job's end, as on one node (supervisor.py)


def _release_kept(launch: Launch, kept: Start, signum: int | None, gatherer: Gatherer) -> list[RemoteLauncher]:
    """The kept launchers released (``_release``) and their sessions closed: the next attempt
    will not run on them."""
    try:
        return _release(launch, kept, signum, gatherer)
    finally:
        for session in kept.sessions:
            session.close()


def _kept_start(start: Start, kept: Sequence[RemoteLauncher]) -> Start:
    """The last attempt's start reduced to the launchers kept for the next one; ``renumbered``
    when that is fewer hosts (the restart word then says each one's new place)."""
    return replace(start, sessions=[lau.session for lau in kept], plans=[lau.plan for lau in kept],
                   renumbered=len(kept) < len(start.sessions), master_moved=False)


def _lost(launchers: Sequence[HostState], elastic: bool, attempt: int) -> dict[str, str]:
    """Hosts whose connection was lost (left out of an elastic job's next attempt)."""
    return {lau.name: f"connection lost in attempt {attempt}" for lau in launchers if lau.lost} if elastic else {}


def _release(launch: Launch, start: Start, signum: int | None, gatherer: Gatherer,
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
    ending = [RemoteLauncher(session=s, plan=plans[s.host.name], log=open(log_dir / f"ssh-{s.host.name}.log", "ab"))
              for s in sessions]
    try:
        relay = Relay(ending, launch.console, launch.settings, grace_period=launch.job.grace_period,
                      heartbeat_interval=launch.heartbeat_interval)
        relay.request_stop("the job ends" if signum is None else f"{signal.Signals(signum).name} on the head",
                           signum)
        relay.run()
        gatherer.gather(ending)
    finally:
        for launcher in ending:
            launcher.log.close()
    return ending


def _restart_backoff(launch: Launch, attempts: list[Attempt], outcome: Outcome, stop: _Stop,
                     log: HeadLog) -> float | None:
    """The wait before the next attempt, or None: no restart (restarts used up, a stop, or a
    failure that will repeat, said in one line); the attempt's end goes to the event log."""
    number = attempts[-1].number
    backoff = next_backoff(attempts, launch.job.restarts, stopping=stop.signum is not None)
    repeat, spared = log.judge(outcome, number)
    if backoff is not None and repeat:
        launch.console.say(f"not restarting: {repeat}")
        backoff = None
    elif backoff is not None and spared:
        launch.console.say(f"restarting: {spared}")
    log.attempt_ended(number, outcome, backoff, repeat, outcome.stop_reason if stop.signum is not None else None)
    return backoff


def _finish(attempts: Sequence[Attempt], console: Console) -> int:
    """The job's exit code (its last attempt's); after restarts, one line per attempt."""
    if len(attempts) > 1:
        console.say(f"{len(attempts)} attempts:")
        for attempt in attempts:
            console.say(f"  {attempt.line()}")
    return attempts[-1].exit_code if attempts else 1


def _target(job: JobSpec, options: FanoutOptions) -> tuple[list[str], list[str]]:
    """What every remote launcher runs (the job file, or ``-- argv``), and the paths preflight
    checks on each host (the job file and its script)."""
    if options.command:
        return ["--", *options.command], []
    target = [os.path.abspath(job.source)] if job.source else ["--", *job.entry_argv()]
    paths = [os.path.abspath(job.source)] if job.source else []
    if job.script:
        paths.append(os.path.abspath(job.script_path()))
    return target, paths


def _run(launch: Launch, start: Start, number: int, stop: _Stop, gatherer: Gatherer, log: HeadLog,
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
    launchers = [RemoteLauncher(session=s, plan=p, log=open(log_dir / f"ssh-{s.host.name}.log", "ab"))
                 for s, p in zip(start.sessions, start.plans)]
    if number:
        for launcher in launchers:
            launcher.log.write(restart_marker(number))
    write_launcher_file(log_dir, socket.gethostname(), launch.run_id,
                        list(range(sum(p.nproc for p in start.plans))), hosts=[p.host for p in start.plans])
    return launchers


def _relay(launch: Launch, launchers: list[RemoteLauncher], log_dir: Path, stop: _Stop, log: HeadLog,
           in_place: int | None) -> Outcome:
    """Relay the started hosts until the end; a stop signal that came before is acted on at once.
    ``in_place``: the attempt, when a failure only ends it (the hosts wait for the next)."""
    relay = Relay(launchers, launch.console, launch.settings, grace_period=launch.job.grace_period,
                  heartbeat_interval=launch.heartbeat_interval, log_dir=log_dir, events=log.events,
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


def head_launch_env(job: JobSpec, head_env: Mapping[str, str]) -> dict[str, str]:
    """What every host's launcher gets from the head: the allow-list, ``ssh.env_allow``, the
    ``env_passthrough`` variables (an unset one is an error before any host is contacted), then
    the job's ``env:``."""
    passthrough_env(job.env_passthrough, head_env, job.source or "<command line>", job.env, job.line_of)
    return {**forwarded_env(head_env, job.ssh.env_allow, job.env_passthrough), **job.env}


def fanout_options(options: RunOptions) -> FanoutOptions:
    """FanoutOptions from ``clusterddp run``'s options; the flags whose rows say so
    (``launch.flags.RUN_FLAGS``) are passed on to every host's launcher."""
    return FanoutOptions(
        hostfile=options.hostfile, include=options.include, exclude=options.exclude,
        nproc_per_node=options.nproc_per_node, master_addr=options.master_addr, master_port=options.master_port,
        run_id=options.run_id, dry_run=options.dry_run, launcher_args=remote_args(options.passed_on))


def _entries(job: JobSpec, options: FanoutOptions) -> list[HostEntry]:
    if options.hostfile:
        entries = read_hostfile(options.hostfile)
    elif job.ssh.hostfile:
        entries = read_hostfile(_job_path(job, job.ssh.hostfile) or job.ssh.hostfile)
    elif job.ssh.hosts:
        places = [job.where(f"ssh.hosts[{i}]") for i in range(len(job.ssh.hosts))]
        entries = entries_from_list(job.ssh.hosts, f"{job.source or 'job'}: ssh.hosts", places)
    else:
        raise RemoteError("no hosts to fan out to", "give --hostfile, or ssh.hosts / ssh.hostfile in the job file")
    # Patterns from the job file carry their file:line: key; the flags' are named as flags.
    include = options.include or [(p, job.where(f"ssh.include[{i}]")) for i, p in enumerate(job.ssh.include)]
    exclude = [(p, job.where(f"ssh.exclude[{i}]")) for i, p in enumerate(job.ssh.exclude)]
    return select_hosts(entries, include, [*exclude, *options.exclude])


def _job_path(job: JobSpec, path: str | None) -> str | None:
    """Paths in the job file are relative to the job file's directory, like ``script``."""
    if path is None:
        return None
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) or job.source is None else os.path.join(job.base_dir, path)


def _raise_fd_limit(n_hosts: int, console: Console) -> None:
    """Each host holds ~4 descriptors (socket, the channel's select pipe, the log copy): lift
    the soft limit towards the hard one so a few hundred hosts do not hit the usual 1024."""
    import resource

    needed = FDS_PER_HOST * n_hosts + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            console.say(f"warning: {n_hosts} hosts need about {needed} file descriptors, the hard limit is {hard}")


def _install(stop: _Stop) -> None:
    for signum in STOP_SIGNALS:
        try:
            stop.previous[signum] = signal.signal(signum, stop)
        except ValueError:  # not the main thread: the caller handles signals
            return
    stop.previous[STACKS_REQUEST_SIGNAL] = signal.signal(STACKS_REQUEST_SIGNAL, stop.stacks)


def _restore(stop: _Stop) -> None:
    for signum, handler in stop.previous.items():
        signal.signal(signum, handler)
