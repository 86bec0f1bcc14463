"""A group of N local workers: start, poll, teardown, close (torch elastic's PContext shape).

Each worker runs in its own process group; teardown SIGTERMs every group (SIGINT after a
Ctrl-C), waits the grace period, then SIGKILLs the groups and what left them (guard.py: the
job's cgroup, process trees, marked processes and orphans reparented to the launcher, its
child subreaper), and ends at most grace_period + TEARDOWN_SLACK after the first SIGTERM. No
signal handlers, no restarts: the supervisor decides when to start and when to stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from clusterddp import exitcodes
from clusterddp.launch.teardown import procs
from clusterddp.launch.teardown.guard import JobGuard
from clusterddp.launch.observe.logs import ConsoleSink, WorkerOutput
from clusterddp.launch.observe.exits import WorkerExit, read_error_file
from clusterddp.launch.start.warm import ForkedProcess, WarmStart
from clusterddp.launch.start.workerenv import WorkerEnv
from clusterddp.protocol import HEARTBEAT_FILE_ENV, STACKS_FILE_ENV, restart_marker

#: Teardown ends at most this long after the grace period that follows the first SIGTERM
#: (everything SIGKILLed, reaped, the cgroup removed, the pipes drained).
TEARDOWN_SLACK = 0.45


@dataclass(frozen=True)
class WorkerPlan:
    """Everything needed to start one worker; built once, reused on restarts."""

    local_rank: int
    rank: int
    argv: tuple[str, ...]
    #: What its environment is made of; ``env.build(attempt, marker)`` is the only writer.
    env: WorkerEnv
    cwd: str
    log: str
    error_file: str
    #: CPUs the worker may run on (clusterddp.affinity); None: the launcher's own mask.
    cpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RankState:
    """What diagnostics may know of one worker: plain data, no process handle."""

    rank: int
    pid: int
    #: The process has not exited (yet).
    running: bool
    #: The group has recorded the worker's exit.
    exited: bool
    #: monotonic time of its last output line (0.0: none yet).
    last_line_at: float
    stacks_file: str | None
    heartbeat_file: str | None


@dataclass
class Worker:
    plan: WorkerPlan
    #: The environment it was started with, as ``WorkerEnv.build`` wrote it.
    env: Mapping[str, str]
    #: A cold worker's Popen, or the ForkedProcess of a warm one (both the launcher's child).
    proc: subprocess.Popen[bytes] | ForkedProcess
    output: WorkerOutput
    pgid: int
    exit: WorkerExit | None = None
    #: The error file of an earlier attempt could not be removed (a read-only or failing log
    #: disk): it is not this attempt's cause, so the report reads the stderr tail instead.
    stale_error_file: bool = False

    def exit_record(self, host: str, stopped_by_us: bool) -> WorkerExit:
        code = self.proc.returncode
        return WorkerExit(host=host, rank=self.plan.rank, local_rank=self.plan.local_rank,
                          pid=self.proc.pid, returncode=-signal.SIGKILL if code is None else code,
                          log=self.plan.log,
                          at=time.time(), stopped_by_us=stopped_by_us)

    def finish(self, host: str, deadline: float, say: Callable[[str], None]) -> None:
        """Its exit, its output drained (until ``deadline``), its report tail."""
        if self.proc.returncode is None:
            try:
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                say(f"clusterddp: warning: rank {self.plan.rank} (pid {self.proc.pid}) did not "
                    "die on SIGKILL (uninterruptible sleep?); leaving it")
        if self.exit is None:
            self.exit = self.exit_record(host, stopped_by_us=True)
        self.output.close(deadline)
        self.exit.log_error = self.output.log_error
        # a rank stopped while it was failing by itself (an exit code, not our signal) keeps
        # its traceback too: the restart verdict weighs how every rank ended (verdict.rank_ends)
        failed = self.exit.returncode > 0 if self.exit.stopped_by_us else self.exit.returncode != 0
        if failed and self.exit.returncode != exitcodes.PREEMPTED:
            recorded = [] if self.stale_error_file else read_error_file(self.plan.error_file)
            self.exit.tail = recorded or list(self.output.stderr_tail)


class WorkerGroup:
    """The workers of one attempt on this node, and what their teardown must reach."""

    def __init__(self, host: str, grace_period: float, console: ConsoleSink, warm: WarmStart | None = None) -> None:
        self.host = host
        self.grace_period = grace_period
        self.console = console
        self.warm = warm  # forks the workers from a warm interpreter while it serves (warm.py)
        self.marker = procs.new_marker()
        self.workers: list[Worker] = []
        self._guard: JobGuard | None = None  # the cgroup, the reaper, adopted orphans (guard.py)

    def open(self) -> None:
        """Become the subreaper of the workers' trees; create the job's cgroup and the reaper."""
        self._guard = JobGuard.open(self.marker)

    def close(self) -> None:
        """Remove the cgroup and stop the reaper (after the last teardown)."""
        if self._guard is not None:
            self._guard.remove_cgroup()
        if self.warm is not None:
            self.warm.close()
        if self._guard is not None:
            self._guard.close_reaper()

    # -- start and poll -------------------------------------------------------------------------

    def new_attempt(self) -> None:
        """Forget the workers of the previous attempt (torn down already)."""
        self.workers = []

    def start_all(self, plans: Sequence[WorkerPlan], attempt: int) -> None:
        """Start this attempt's workers, in order (each one's stale error file removed, its
        output pumped), with the environment its plan builds for ``attempt`` and this group's
        marker; forked ones are all asked for at once (the zygote forks them back to back), the
        others start cold."""
        if self._guard is None:
            raise RuntimeError("WorkerGroup.start_all before open()")
        envs = [plan.env.build(attempt, self.marker) for plan in plans]
        stale = [not _remove_error_file(plan.error_file) for plan in plans]  # before its worker can write one
        if attempt > 0:
            for plan in plans:
                _mark_attempt(plan.log, attempt)
        forked: list[ForkedProcess | None] = [None] * len(plans)
        if self.warm is not None:
            forked = self.warm.spawn_all(list(zip(plans, envs)), self._guard.cgroup, self._guard.orphans.keep)
        for plan, env, fork, was_stale in zip(plans, envs, forked, stale):
            output = WorkerOutput(plan.rank, self.host, plan.log, self.console)
            proc = fork or procs.spawn(plan.argv, env, plan.cwd, self._guard.cgroup, plan.cpus)
            self._guard.reaper.watch(proc.pid)
            output.pump(proc.stdout, proc.stderr)
            self.workers.append(Worker(plan=plan, env=env, proc=proc, output=output, pgid=proc.pid,
                                       stale_error_file=was_stale))

    def poll(self) -> list[WorkerExit]:
        """Record the exits that happened since the last poll; return the failures among them."""
        failed = []
        for worker in self.workers:
            if worker.exit is None and worker.proc.poll() is not None:
                worker.exit = worker.exit_record(self.host, stopped_by_us=False)
                if worker.exit.returncode != 0:
                    failed.append(worker.exit)
        return failed

    def all_exited(self) -> bool:
        return all(w.exit is not None for w in self.workers)

    def exits(self) -> list[WorkerExit]:
        return [w.exit for w in self.workers if w.exit is not None]

    def preempted(self) -> bool:
        return any(w.exit is not None and w.exit.returncode == exitcodes.PREEMPTED for w in self.workers)

    def states(self) -> list[RankState]:
        return [RankState(rank=w.plan.rank, pid=w.proc.pid, running=w.proc.poll() is None,
                          exited=w.exit is not None, last_line_at=w.output.last_line_at,
                          stacks_file=w.env.get(STACKS_FILE_ENV),
                          heartbeat_file=w.env.get(HEARTBEAT_FILE_ENV)) for w in self.workers]

    def signal_workers(self, signum: int) -> None:
        """``signum`` to each live worker process only, not its group: SIGUSR1's default
        action would kill DataLoader workers that never asked for it."""
        for worker in self.workers:
            if worker.proc.poll() is None:
                try:
                    os.kill(worker.proc.pid, signum)
                except ProcessLookupError:
                    pass

    def check_reaper(self) -> str | None:
        """Replace a reaper that died or was stopped (said on the console); the cause to stop
        the job when it cannot be replaced (for the report), else None."""
        loss = self._guard.check_reaper() if self._guard is not None else None
        if loss is None:
            return None
        if loss.cause is None:
            self.console.say(loss.line())
        return loss.cause

    def _keep_reaper(self) -> None:
        """``check_reaper`` during a teardown: stopping already, the cause only goes to the console."""
        cause = self.check_reaper()
        if cause is not None:
            self.console.say(f"clusterddp: warning: {cause}")

    def adopt_orphans(self) -> None:
        if self._guard is not None:
            self._guard.adopt(w.proc.pid for w in self.workers)

    # -- teardown -------------------------------------------------------------------------------

    def teardown(self, patient: bool = False, signum: int = signal.SIGTERM) -> None:
        """``signum`` to every group, wait the grace period, SIGKILL everything, reap; done at
        most grace_period + TEARDOWN_SLACK after the first signal.

        ``signum``: SIGTERM, or the SIGINT of a Ctrl-C (``protocol.worker_stop_signal``), so a
        script's ``except KeyboardInterrupt`` runs. ``patient``: a worker was preempted and
        saved a checkpoint; its peers are most likely saving or exiting too, so they get the
        grace period to finish before any signal.
        """
        trees = procs.descendants(w.proc.pid for w in self.workers if w.proc.poll() is None)
        self.poll()  # a worker that ended on its own is not "stopped by clusterddp"
        if patient:
            self._wait_workers(self.workers, time.monotonic() + self.grace_period)
            self.poll()
        live = [w for w in self.workers if w.proc.poll() is None]
        grace_end = time.monotonic() + (self.grace_period if live else 0.0)
        for worker in live:
            procs.signal_group(worker.pgid, signum)
        self._wait_workers(live, grace_end)
        # SIGKILL every group (also of workers that exited: their children may linger), then
        # what left the groups (guard.py).
        for worker in self.workers:
            procs.signal_group(worker.pgid, signal.SIGKILL)
        if self._guard is not None:
            self._guard.kill(trees, (w.proc.pid for w in self.workers))
        deadline = grace_end + TEARDOWN_SLACK
        self._reap_all(deadline)
        for worker in self.workers:
            worker.finish(self.host, deadline, self.console.say)

    def _reap_all(self, deadline: float) -> None:
        """Until all is gone or ``deadline``: reap the workers and adopted orphans, kill late
        orphans, wait for the groups and the cgroup to hold no live process (a zombie whose
        parent is not us does not count)."""
        pgids = [w.pgid for w in self.workers]
        while True:
            self._keep_reaper()
            for worker in self.workers:
                worker.proc.poll()
            self.adopt_orphans()
            if self._guard is not None:
                self._guard.orphans.kill()
            if all(w.proc.returncode is not None for w in self.workers) \
                    and (self._guard is None or self._guard.gone()) and not procs.live_groups(pgids):
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    def _wait_workers(self, workers: list[Worker], deadline: float) -> None:
        """Wait for the workers to exit until the deadline (the caller escalates after),
        replacing a reaper lost meanwhile: a kill -9 of the launcher during a long grace
        period must still take every worker's children along."""
        delay = 0.0005  # as Popen.wait: quick to see a worker that dies on SIGTERM at once
        while any(w.proc.poll() is None for w in workers) and time.monotonic() < deadline:
            self._keep_reaper()
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.005)


def _remove_error_file(path: str) -> bool:
    """Remove an earlier attempt's error file; False when one may remain (the log disk went
    read-only or fails: the attempt still starts, its output goes to the console only)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        return not os.path.lexists(path)
    return True


def _mark_attempt(log: str, attempt: int) -> None:
    """The restart marker between attempts in a rank's log (a restart appends to the same
    file); a log that cannot be written is no failure."""
    try:
        with open(log, "ab") as handle:
            handle.write(restart_marker(attempt))
    except OSError:
        pass
