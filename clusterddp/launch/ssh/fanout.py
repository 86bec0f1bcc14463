"""``clusterddp run JOB --hostfile F``: the same launcher on every host, supervised from here.

The job's fan-out is settled once (``attempt.launch_of``: the hosts, hostfile + ssh_config,
the master, every launcher's env), then the head's loop (``HeadLoop``) goes through named
states, each one step, in this order on a failure that is restarted::

    PROBING      connect and probe every candidate in parallel, preflight (all problems at
                 once, nothing started), choose the hosts, one ``LaunchPlan`` per host
    RUNNING      GO to every stub at once, relay output and keepalives until the end, report
                 naming the host that failed first (``running``)
    JUDGING      restart or not (``restarts: N``, the verdict, a stop); keep the launchers
                 waiting for the next attempt when they all may (``inplace``)
    RELEASING    else end the waiting ones (``running``)
    BACKING_OFF  the wait, with keepalives to the launchers kept
    RESUMING     the next attempt on the kept launchers (the restart word), or PROBING anew
    ...          until ENDED, with the job's exit code

``TRANSITIONS`` lists every step the loop may take; ``attempt`` holds the rules of an attempt.
docs/ssh.md is the user's guide to all of it.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from clusterddp.launch.flags import remote_args
from clusterddp.launch.options import RunOptions
from clusterddp.launch.supervise import runlock
from clusterddp.launch.ssh import inplace
from clusterddp.launch.ssh.attempt import (Attempt, FanoutOptions, Launch, Start, dry_run_text, launch_of, next_backoff,
                                           prepare, restart_line)
from clusterddp.launch.ssh.headlog import Gatherer, HeadLog
from clusterddp.launch.ssh.io import Console, RemoteLauncher
from clusterddp.launch.ssh.outcome import HostState, Outcome, attempt_failure
from clusterddp.launch.ssh.reach import PreflightError
from clusterddp.launch.ssh.running import Stop, release_launchers, run_attempt
from clusterddp.spec import JobSpec

__all__ = ["FanoutOptions", "HeadLoop", "HeadState", "IllegalTransition", "TRANSITIONS", "fanout_options", "run_fanout", "transition"]

FDS_PER_HOST = 5


def run_fanout(job: JobSpec, options: FanoutOptions) -> int:
    """Run ``job`` on every host (restarting the whole job up to ``restarts`` times); return the
    exit code (0, or the first failure's of the last attempt)."""
    loop = HeadLoop(launch_of(job, options))
    loop.stop.install()
    try:
        return loop.run()
    finally:
        loop.stop.restore()


class HeadState(enum.Enum):
    """Where the head's loop stands (torch elastic's ``WorkerState``, for a whole fan-out);
    ``TRANSITIONS`` says which state may follow which."""

    #: Attempt N launched anew: connect to and probe every candidate, preflight, choose, plan.
    PROBING = "probing"
    #: Attempt N on the launchers that waited for it (``inplace``): no probe, the restart word.
    RESUMING = "resuming"
    #: Every host started (GO, or the restart word), relayed to the end; the attempt recorded.
    RUNNING = "running"
    #: Restart or not (restarts left, the verdict, a stop), and which launchers may wait for it.
    JUDGING = "judging"
    #: Launchers that wait for a word that will not come: EOF, their last lines, their logs.
    RELEASING = "releasing"
    #: The wait before the next attempt, with keepalives to the launchers kept waiting.
    BACKING_OFF = "backing_off"
    #: The job's exit code is known.
    ENDED = "ended"


_S = HeadState
#: What may follow each state (None: the loop before its first). Anything else is a bug.
TRANSITIONS: dict[HeadState | None, frozenset[HeadState]] = {
    None: frozenset({_S.PROBING}),
    # ENDED: a dry run, a stop during preflight, a restart whose preflight failed
    _S.PROBING: frozenset({_S.RUNNING, _S.ENDED}),
    # RELEASING: a stop came as the restart word was due
    _S.RESUMING: frozenset({_S.RUNNING, _S.RELEASING}),
    _S.RUNNING: frozenset({_S.JUDGING}),
    # BACKING_OFF: the launchers wait for the next attempt in place; else the waiting ones go
    _S.JUDGING: frozenset({_S.BACKING_OFF, _S.RELEASING}),
    # BACKING_OFF: restart anew; PROBING: a kept launcher ended during the backoff; ENDED: no restart
    _S.RELEASING: frozenset({_S.BACKING_OFF, _S.PROBING, _S.ENDED}),
    # RELEASING / ENDED: a stop during the backoff (with / without launchers kept waiting)
    _S.BACKING_OFF: frozenset({_S.PROBING, _S.RESUMING, _S.RELEASING, _S.ENDED}),
    _S.ENDED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """The head's loop tried a step ``TRANSITIONS`` does not allow: a bug in the loop."""


def transition(current: HeadState | None, new: HeadState) -> HeadState:
    """``new``, when ``TRANSITIONS`` lets it follow ``current``; else ``IllegalTransition``."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"the SSH head cannot go from {current.name if current else 'its start'} "
                                f"to {new.name}")
    return new


@dataclass(frozen=True)
class _Kept:
    """The last attempt's launchers that wait for the restart word, and their hosts' start."""

    start: Start
    launchers: list[RemoteLauncher]


@dataclass(frozen=True)
class _Release:
    """What RELEASING ends, and the state after it."""

    #: Whose sessions are closed once released.
    start: Start
    #: The attempt's own launchers, of which the waiting ones are released; None: every
    #: session of ``start`` (launchers kept waiting).
    launchers: list[RemoteLauncher] | None
    then: HeadState
    #: The job's exit code when it ends on a stop (else its last attempt's).
    code: int | None = None


class HeadLoop:
    """The head's attempts as named states (``HeadState``), one step (a method) per state, each
    answering the next; ``_enter`` is the one place where the state changes, checked against
    ``TRANSITIONS``. What a step leaves for the next is in the fields below (the attempt in
    hand, its outcome, the launchers kept or to release), each set by the steps that the table
    puts before its readers."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        #: The head's stop signals (``run_fanout`` installs it; a loop in a thread runs without).
        self.stop = Stop()
        self.run_dir = Path(launch.job.logs.dir) / launch.run_id
        self.gatherer = Gatherer(os.path.join(launch.job.logs.dir, launch.run_id), self.run_dir,
                                 launch.console, launch.settings.timeout)
        self.head_lock = runlock.RankLocks()
        self.log = HeadLog(launch.job)
        self.state: HeadState | None = None
        #: Every state entered, in order: the path the run took.
        self.trace: list[HeadState] = []
        self.attempts: list[Attempt] = []
        #: Hosts whose connection was lost in the last attempt (an elastic job leaves them out).
        self.dead: dict[str, str] = {}
        #: The attempt in hand (its sessions are the head's) and whether it runs in place.
        self.start: Start | None = None
        self.in_place = False
        self.outcome: Outcome | None = None
        #: Seconds before the next attempt (None: the job ends), the verdict's.
        self.backoff: float | None = None
        self.kept: _Kept | None = None
        self.release: _Release | None = None
        #: The job's exit code, once ENDED.
        self.code = 1

    def run(self) -> int:
        """Every attempt, from the first probe to the job's end; the job's exit code."""
        launch = self.launch
        _raise_fd_limit(len(launch.hosts), launch.console)
        nodes = f", nodes {launch.low}:{launch.high} of {len(launch.hosts)} listed" if launch.job.elastic else ""
        launch.console.say(f"{len(launch.hosts)} hosts{nodes}, run id {launch.run_id}; "
                           f"host keys: {launch.settings.policy_name}")
        steps = {_S.PROBING: self._probe, _S.RESUMING: self._resume, _S.RUNNING: self._run,
                 _S.JUDGING: self._judge, _S.RELEASING: self._release, _S.BACKING_OFF: self._back_off}
        try:
            state = self._enter(_S.PROBING)
            while state is not _S.ENDED:
                state = self._enter(steps[state]())
            self.log.close(self.code)
            return self.code
        finally:
            self.log.close(None)
            self.head_lock.release()
            for start in (self.start, self.kept.start if self.kept else None):
                for session in start.sessions if start else ():
                    session.close()  # on an error: no stub outlives the head

    def _enter(self, state: HeadState) -> HeadState:
        self.state = transition(self.state, state)
        self.trace.append(state)
        return state

    def _end(self, code: int) -> HeadState:
        self.code = code
        return _S.ENDED

    def _abandon(self, code: int) -> HeadState:
        """The job ends before its attempt in hand started: its stubs see EOF and exit."""
        for session in self.start.sessions if self.start else ():
            session.close()
        self.start = None
        return self._end(code)

    def _probe(self) -> HeadState:
        """PROBING: attempt N's hosts probed and planned (``attempt.prepare``); a dry run, a stop
        meanwhile or a restart's failed preflight ends the job here."""
        launch, number = self.launch, len(self.attempts)
        try:
            self.start, self.in_place = prepare(launch, number, self.dead), False
        except PreflightError as exc:
            if not self.attempts:
                raise
            launch.console.say(f"restart {number}: {exc}")
            for detail in exc.details:
                launch.console.say(f"  {detail}")
            return self._end(_finish(self.attempts, launch.console))
        start = self.start
        if launch.options.dry_run:
            launch.console.write_out(dry_run_text(launch.job, start.plans, start.sessions, start.master_addr,
                                                  start.master_port, launch.run_id))
            return self._abandon(0)
        if self.stop.signum is not None:
            launch.console.say(f"{signal.Signals(self.stop.signum).name} during preflight: nothing was started")
            return self._abandon(128 + self.stop.signum if not self.attempts else _finish(self.attempts, launch.console))
        return _S.RUNNING

    def _resume(self) -> HeadState:
        """RESUMING: attempt N planned on the kept launchers (``inplace.in_place_start``)."""
        assert self.kept is not None  # BACKING_OFF resumes only with launchers kept
        self.start, self.kept = self.kept.start, None
        self.start, self.in_place = inplace.in_place_start(self.launch, self.start, len(self.attempts), self.dead), True
        if self.stop.signum is not None:
            self.launch.console.say(f"{signal.Signals(self.stop.signum).name} during preflight: nothing was started")
            self.release = _Release(self.start, None, _S.ENDED)
            return _S.RELEASING
        return _S.RUNNING

    def _run(self) -> HeadState:
        """RUNNING: the attempt from the head lock to its record in ``attempts``. The lock is
        taken once the first preflight passed, before any host starts: a second job with this
        run id would overwrite launcher.json and append to the first's ssh-<host>.log (its hosts
        would refuse it too, later and once per host)."""
        launch, start, number = self.launch, self.start, len(self.attempts)
        assert start is not None  # PROBING and RESUMING leave the attempt's hosts
        if not self.head_lock.fds:
            self.head_lock.fds = runlock.lock_head(str(self.run_dir), launch.job.where("logs.dir"), launch.run_id).fds
        hosts = [p.host for p in start.plans]
        world = sum(p.nproc for p in start.plans)
        self.log.open(str(self.run_dir), hosts)
        if number == 0 and launch.code is not None:
            self.log.code_shipped(launch.code, [p.cwd for p in start.plans])
        self.log.attempt_started(number, hosts, world)
        began = time.monotonic()
        self.outcome = run_attempt(launch, start, number, self.stop, self.gatherer, self.log, in_place=self.in_place)
        self.attempts.append(Attempt(number=number, hosts=tuple(hosts), world_size=world,
                                     exit_code=self.outcome.exit_code, failure=attempt_failure(self.outcome),
                                     seconds=time.monotonic() - began))
        return _S.JUDGING

    def _judge(self) -> HeadState:
        """JUDGING: restart or not; on a restart, the launchers that wait for it in place, when
        they all may (``inplace.keepable``)."""
        launch, start, outcome = self.launch, self.start, self.outcome
        assert start is not None and outcome is not None  # RUNNING leaves both
        self.backoff = _restart_backoff(launch, self.attempts, outcome, self.stop, self.log)
        waiting = [lau for lau in outcome.launchers if isinstance(lau, RemoteLauncher)]
        kept = inplace.keepable(launch, waiting) if self.backoff is not None and self.stop.signum is None else None
        self.dead = _lost(outcome.launchers, launch.job.elastic, len(self.attempts))
        if not kept:
            self.release = _Release(start, waiting, _S.ENDED if self.backoff is None else _S.BACKING_OFF)
            return _S.RELEASING
        for session in start.sessions:
            if all(session is not lau.session for lau in kept):
                session.close()
        self.start, self.kept = None, _Kept(_kept_start(start, kept), kept)
        return _S.BACKING_OFF

    def _release(self) -> HeadState:
        """RELEASING: the launchers ``self.release`` names ended, their sessions closed; the
        hosts lost meanwhile join ``dead``."""
        release, self.release = self.release, None
        assert release is not None  # set by the state that chose RELEASING
        if release.start is self.start:
            self.start = None
        try:
            released = release_launchers(self.launch, release.start, self.stop.signum, self.gatherer,
                                         release.launchers)
        finally:
            for session in release.start.sessions:
                session.close()
        self.dead.update(_lost(released, self.launch.job.elastic, len(self.attempts)))
        if release.then is _S.ENDED:
            code = _finish(self.attempts, self.launch.console)
            return self._end(code if release.code is None else release.code)
        return release.then

    def _back_off(self) -> HeadState:
        """BACKING_OFF: the restart's line, then its wait, counted from the failure (stopping the
        other hosts was part of it); the kept launchers still waiting, the restart is in place."""
        launch, outcome, backoff = self.launch, self.outcome, self.backoff
        assert outcome is not None and backoff is not None  # JUDGING chose a restart
        launch.console.say(restart_line(self.attempts[-1], launch.job.restarts, backoff, self.dead))
        stopping = time.monotonic() - outcome.stop_began if outcome.stop_began is not None else 0.0
        if inplace.keep_alive(self.kept.launchers if self.kept else [], backoff - stopping,
                              lambda: self.stop.signum is not None, launch.keepalive_interval):
            return self._stopped()
        if self.kept is None:
            return _S.PROBING
        if not inplace.still_waiting(self.kept.launchers):  # one ended meanwhile: all launched anew
            self.dead, self.release, self.kept = {}, _Release(self.kept.start, None, _S.PROBING), None
            return _S.RELEASING
        return _S.RESUMING

    def _stopped(self) -> HeadState:
        """A stop signal during the backoff: the job ends, as on one node (supervisor.py), its
        waiting launchers released."""
        signum = self.stop.signum or signal.SIGTERM
        self.launch.console.say(f"{signal.Signals(signum).name} before the restart: not restarting")
        self.log.emit("stop", why=f"{signal.Signals(signum).name} on the head before the restart")
        if self.kept is None:
            _finish(self.attempts, self.launch.console)
            return self._end(128 + signum)
        self.release, self.kept = _Release(self.kept.start, None, _S.ENDED, 128 + signum), None
        return _S.RELEASING


def _kept_start(start: Start, kept: Sequence[RemoteLauncher]) -> Start:
    """The last attempt's start reduced to the launchers kept for the next one; ``renumbered``
    when that is fewer hosts (the restart word then says each one's new place)."""
    return replace(start, sessions=[lau.session for lau in kept], plans=[lau.plan for lau in kept],
                   renumbered=len(kept) < len(start.sessions), master_moved=False)


def _lost(launchers: Sequence[HostState], elastic: bool, attempt: int) -> dict[str, str]:
    """Hosts whose connection was lost (left out of an elastic job's next attempt)."""
    return {lau.name: f"connection lost in attempt {attempt}" for lau in launchers if lau.lost} if elastic else {}


def _restart_backoff(launch: Launch, attempts: list[Attempt], outcome: Outcome, stop: Stop,
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


def fanout_options(options: RunOptions) -> FanoutOptions:
    """FanoutOptions from ``clusterddp run``'s options; the flags whose rows say so
    (``launch.flags.RUN_FLAGS``) are passed on to every host's launcher."""
    return FanoutOptions(
        hostfile=options.hostfile, include=options.include, exclude=options.exclude,
        nproc_per_node=options.nproc_per_node, master_addr=options.master_addr, master_port=options.master_port,
        run_id=options.run_id, dry_run=options.dry_run, launcher_args=remote_args(options.passed_on))


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
