"""The local supervisor: N workers on this node; one fails, all stop; nothing left running.

Follows torch elastic's shape (a process group per worker, SIGTERM then SIGKILL after a grace
period, signals turned into an orderly stop) and goes beyond it: workers die with the
launcher (PDEATHSIG + a reaper), whole process trees are reaped (the launcher is their child
subreaper, and the job has its own cgroup v2 where one can be created: procs.py lists what
each mechanism covers), teardown ends at most grace_period + TEARDOWN_SLACK after the first
SIGTERM, and the report names the host, rank, log and last lines of the first failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from clusterddp import exitcodes
from clusterddp.hang import RankLife, culprit, last_progress, stalled_for
from clusterddp.launch import procs
from clusterddp.launch.cgroup import JobCgroup
from clusterddp.launch.logs import ConsoleSink, WorkerOutput
from clusterddp.launch.report import WorkerExit, format_report, read_error_file
from clusterddp.launch.stackdump import Target, collect
from clusterddp.protocol import (HEARTBEAT_FILE_ENV, STACKS_FILE_ENV, STACKS_REQUEST_BYTE, STACKS_REQUEST_SIGNAL,
                                 SUPERVISOR_ID_ENV, result_line, stacks_block_title, stacks_line,
                                 write_launcher_file, write_stacks_report)
from clusterddp.stackreport import StacksReport, build_report
from clusterddp.topology import STOP_SIGNAL_NAMES, Topology

#: Signals that stop the job in an orderly way (like torchrun's --signals-to-handle).
STOP_SIGNALS = tuple(getattr(signal, name) for name in STOP_SIGNAL_NAMES)
#: Exits a restart cannot fix: preempted (the scheduler requeues), non-finite loss (same state,
#: same NaN).
NOT_RESTARTED = (exitcodes.PREEMPTED, exitcodes.NONFINITE_LOSS)
#: Longest pause between restarts of the local group.
MAX_BACKOFF = 30.0
#: Teardown ends at most this long after the grace period that follows the first SIGTERM
#: (everything SIGKILLed, reaped, the cgroup removed, the pipes drained).
TEARDOWN_SLACK = 0.45


@dataclass(frozen=True)
class WorkerPlan:
    """Everything needed to start one worker; built once, reused on restarts."""

    local_rank: int
    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    log: str
    error_file: str
    #: CPUs the worker may run on (clusterddp.affinity); None: the launcher's own mask.
    cpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SupervisorOptions:
    """How to supervise; filled from the job file and CLI flags."""

    job_name: str
    grace_period: float = 5.0
    restarts: int = 0
    forward_signals: tuple[int, ...] = (signal.SIGUSR1, signal.SIGUSR2)
    console_ranks: frozenset[int] | None = None
    prefix: bool = True
    #: Stop when stdin reaches EOF or stays silent this long (the SSH head's heartbeat).
    watch_stdin: bool = False
    heartbeat_timeout: float = 6.0
    #: Print one machine-readable result line at the end (for the SSH head).
    report_json: bool = False
    #: Tear down with exitcodes.HANG when no rank made progress for this long (seconds).
    hang_timeout: float | None = None
    #: logs/<run-id>: where launcher.json and stack dumps go.
    run_dir: str | None = None


@dataclass
class _Worker:
    plan: WorkerPlan
    proc: subprocess.Popen[bytes]
    output: WorkerOutput
    pgid: int
    exit: WorkerExit | None = None


@dataclass
class LocalSupervisor:
    """Runs the workers of this node until they all succeed, one fails, or we are told to stop."""

    topology: Topology
    plans: list[WorkerPlan]
    options: SupervisorOptions
    _wake: threading.Event = field(default_factory=threading.Event)
    _stop_reason: str | None = None
    _stop_signal: int | None = None
    _workers: list[_Worker] = field(default_factory=list)
    _marker: str = field(default_factory=procs.new_marker)
    _stacks_requested: bool = False
    _hang: bool = False
    _attempt_started: float = 0.0
    #: monotonic time of the attempt's first sign of life (None: every rank still starting)
    _first_life: float | None = None
    _console: ConsoleSink | None = None
    _cgroup: JobCgroup | None = None
    _reaper: procs.Reaper | None = None
    #: Children of the launcher that are not workers of this attempt (the reaper, ...).
    _not_adopted: set[int] = field(default_factory=set)
    #: Orphans of the workers reparented to the launcher (it is their subreaper).
    _adopted: set[int] = field(default_factory=set)

    def run(self) -> int:
        """Supervise to the end and return the launcher's exit code."""
        console = self._sink()
        procs.become_subreaper()
        self._not_adopted = procs.children()
        self._cgroup = JobCgroup.create(self._marker)
        reaper = self._reaper = procs.Reaper(self._marker, self._cgroup.path if self._cgroup else None)
        self._not_adopted.add(reaper.pid)
        self._write_launcher_file()
        previous = self._install_signal_handlers()
        if self.options.watch_stdin:
            self._start_stdin_watch()
        try:
            code, exits, root = self._run_with_restarts(reaper)
        finally:
            self._restore_signal_handlers(previous)
            if self._cgroup is not None:
                self._cgroup.remove(time.monotonic() + 1.0)
            reaper.close()
        report = format_report(self.options.job_name, exits, root,
                               self._stop_reason if code != 0 else None)
        if report:
            console.say(report)
        if self.options.report_json:
            console.say(result_line(code, self.topology.host, root.to_json() if root else None,
                                    self._stop_reason), stderr=False)
        console.settle()
        return code

    def _sink(self) -> ConsoleSink:
        """The one console of this launcher: its messages and every rank's lines."""
        if self._console is None:
            self._console = ConsoleSink(prefix=self.options.prefix, ranks=self.options.console_ranks)
        return self._console

    def _say(self, text: str) -> None:
        """A message of the launcher on stderr; a console that went away is not an error."""
        self._sink().say(text)

    def request_stop(self, reason: str, signum: int | None = None) -> None:
        """Ask the run loop to tear everything down (safe from signal handlers and threads)."""
        if self._stop_reason is None:
            self._stop_reason = reason
            self._stop_signal = signum
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------------

    def _run_with_restarts(self, reaper: procs.Reaper) -> tuple[int, list[WorkerExit], WorkerExit | None]:
        attempt = 0
        while True:
            exits, root = self._run_once(reaper, attempt)
            if root is None and self._stop_reason is None:
                return 0, exits, None
            if root is not None and self._stop_reason is None and attempt < self.options.restarts \
                    and root.exit_code not in NOT_RESTARTED:
                attempt += 1
                backoff = min(float(2 ** (attempt - 1)), MAX_BACKOFF)
                self._say(f"clusterddp: rank {root.rank} on {root.host} {root.outcome()}; restarting the "
                          f"local group in {backoff:.0f}s (restart {attempt} of {self.options.restarts})")
                if self._wake.wait(backoff) and self._stop_reason is not None:
                    return self._stop_code(root, exits), exits, root
                self._wake.clear()
                continue
            return self._stop_code(root, exits), exits, root

    def _stop_code(self, root: WorkerExit | None, exits: list[WorkerExit]) -> int:
        if self._hang:
            return exitcodes.HANG
        if root is not None:
            # The first failure decides, also when peers then saved checkpoints on our SIGTERM
            # and exited 75: a crashed job must not look preempted and be requeued.
            return root.exit_code or 1
        if any(e.returncode == exitcodes.PREEMPTED for e in exits):
            # Stopped by a signal (a scheduler's SIGTERM) while the workers saved checkpoints:
            # report 75 so SLURM's requeue logic sees a preemption, not 143.
            return exitcodes.PREEMPTED
        if self._stop_signal is not None:
            return 128 + self._stop_signal
        return 1

    def _run_once(self, reaper: procs.Reaper, attempt: int) -> tuple[list[WorkerExit], WorkerExit | None]:
        self._workers = []
        self._attempt_started = time.monotonic()
        self._first_life = None
        try:
            for plan in self.plans:
                if self._stop_reason is not None:
                    break
                self._workers.append(self._start(plan, attempt, reaper))
            root = self._watch()
        finally:
            self._teardown(patient=self._preempted())
        return [w.exit for w in self._workers if w.exit is not None], root

    def _start(self, plan: WorkerPlan, attempt: int, reaper: procs.Reaper) -> _Worker:
        env = dict(plan.env)
        env["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
        env[SUPERVISOR_ID_ENV] = self._marker
        try:
            os.unlink(plan.error_file)
        except FileNotFoundError:
            pass
        output = WorkerOutput(plan.rank, self.topology.host, plan.log, self._sink())
        proc = procs.spawn(plan.argv, env, plan.cwd, self._cgroup, plan.cpus)
        reaper.watch(proc.pid)
        output.pump(proc.stdout, proc.stderr)
        return _Worker(plan=plan, proc=proc, output=output, pgid=proc.pid)

    def _watch(self) -> WorkerExit | None:
        """Wait until all succeed (None) or the first failure (returned) or a stop request."""
        while True:
            if self._stop_reason is not None:
                return None
            failed = self._collect_exits()
            if failed:
                return min(failed, key=lambda e: e.at)
            if all(w.exit is not None for w in self._workers):
                return None
            self._check_heartbeat()
            if self._stacks_requested:
                self._stacks_requested = False
                self.dump_stacks("requested")
            self._check_hang()
            self._adopt_orphans()
            self._wake.wait(0.1)
            self._wake.clear()

    def _collect_exits(self) -> list[WorkerExit]:
        failed = []
        for worker in self._workers:
            if worker.exit is None and worker.proc.poll() is not None:
                worker.exit = self._exit_of(worker, stopped_by_us=False)
                if worker.exit.returncode != 0:
                    failed.append(worker.exit)
        return failed

    def _exit_of(self, worker: _Worker, stopped_by_us: bool) -> WorkerExit:
        code = worker.proc.returncode
        return WorkerExit(host=self.topology.host, rank=worker.plan.rank, local_rank=worker.plan.local_rank,
                          pid=worker.proc.pid, returncode=-signal.SIGKILL if code is None else code,
                          log=worker.plan.log,
                          at=time.time(), stopped_by_us=stopped_by_us)

    def _preempted(self) -> bool:
        return any(w.exit is not None and w.exit.returncode == exitcodes.PREEMPTED for w in self._workers)

    def _teardown(self, patient: bool = False) -> None:
        """SIGTERM every group, wait the grace period, SIGKILL everything, reap; the launcher
        is done at most grace_period + TEARDOWN_SLACK after the first SIGTERM.

        ``patient``: a worker was preempted and saved a checkpoint; its peers are most likely
        saving or exiting too, so they get the grace period to finish before any SIGTERM.
        """
        trees = procs.descendants(w.proc.pid for w in self._workers if w.proc.poll() is None)
        self._collect_exits()  # a worker that ended on its own is not "stopped by clusterddp"
        if patient:
            self._wait_workers(self._workers, time.monotonic() + self.options.grace_period)
            self._collect_exits()
        live = [w for w in self._workers if w.proc.poll() is None]
        grace_end = time.monotonic() + (self.options.grace_period if live else 0.0)
        for worker in live:
            procs.signal_group(worker.pgid, signal.SIGTERM)
        self._wait_workers(live, grace_end)
        self._kill_all(trees)
        deadline = grace_end + TEARDOWN_SLACK
        self._reap_all(deadline)
        for worker in self._workers:
            self._finish(worker, deadline)

    def _kill_all(self, trees: list[tuple[int, int]]) -> None:
        """SIGKILL every group (also of workers that exited: their children may linger), the
        job's cgroup, then what left the group: setsid children (trees), marked processes,
        and orphans reparented to us (double forks that cleared their environment)."""
        for worker in self._workers:
            procs.signal_group(worker.pgid, signal.SIGKILL)
        if self._cgroup is not None:
            self._cgroup.kill()
        procs.kill_processes(trees)
        procs.kill_marked(self._marker)
        self._adopt_orphans()
        procs.kill_pids(self._adopted)

    def _reap_all(self, deadline: float) -> None:
        """Until all is gone or ``deadline``: reap the workers and adopted orphans (by pid,
        never waitpid(-1)), kill late orphans, wait for the groups and the cgroup to hold no
        live process (a zombie whose parent is not us does not count)."""
        pgids = [w.pgid for w in self._workers]
        while True:
            for worker in self._workers:
                worker.proc.poll()
            self._adopt_orphans()
            procs.kill_pids(self._adopted)
            if all(w.proc.returncode is not None for w in self._workers) and not self._adopted \
                    and (self._cgroup is None or self._cgroup.empty()) and not procs.live_groups(pgids):
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    def _finish(self, worker: _Worker, deadline: float) -> None:
        """The worker's exit, its output drained (until ``deadline``), its report tail."""
        if worker.proc.returncode is None:
            try:
                worker.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self._say(f"clusterddp: warning: rank {worker.plan.rank} (pid {worker.proc.pid}) did not "
                          "die on SIGKILL (uninterruptible sleep?); leaving it")
        if worker.exit is None:
            worker.exit = self._exit_of(worker, stopped_by_us=True)
        worker.output.close(deadline)
        worker.exit.log_error = worker.output.log_error
        if worker.exit.returncode not in (0, exitcodes.PREEMPTED) and not worker.exit.stopped_by_us:
            worker.exit.tail = read_error_file(worker.plan.error_file) or list(worker.output.stderr_tail)

    def _adopt_orphans(self) -> None:
        """Orphans of the workers reparented to the launcher: tell the reaper (so they die
        with a launcher killed by SIGKILL too), and collect the ones that exited."""
        known = self._not_adopted | {w.proc.pid for w in self._workers}
        found = procs.children() - known
        for pid in found - self._adopted:
            if self._reaper is not None:
                self._reaper.watch_pid(pid)
        self._adopted |= found
        self._adopted -= procs.reap(self._adopted)

    @staticmethod
    def _wait_workers(workers: list[_Worker], deadline: float) -> None:
        """Wait for the workers to exit until the deadline (the caller escalates after)."""
        for worker in workers:
            try:
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    # -- signals and the SSH session ------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, self._on_stop_signal)
        for sig in self.options.forward_signals:
            previous[sig] = signal.signal(sig, self._on_forward_signal)
        previous[STACKS_REQUEST_SIGNAL] = signal.signal(STACKS_REQUEST_SIGNAL, self._on_stacks_signal)
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: self._wake.set())
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self.request_stop(f"the launcher received {signal.Signals(signum).name}", signum)

    def _on_stacks_signal(self, _signum: int, _frame: object) -> None:
        self._stacks_requested = True
        self._wake.set()

    def _on_forward_signal(self, signum: int, _frame: object) -> None:
        # To the worker process only, not its group: SIGUSR1's default action would kill
        # DataLoader workers that never asked for it.
        for worker in self._workers:
            if worker.proc.poll() is None:
                try:
                    os.kill(worker.proc.pid, signum)
                except ProcessLookupError:
                    pass

    def _start_stdin_watch(self) -> None:
        self._last_heartbeat = time.monotonic()

        def watch() -> None:
            # os.read on the raw fd, not sys.stdin.buffer: a daemon thread blocked inside the
            # buffered reader holds its lock at interpreter exit, and Python aborts (exit 134).
            while True:
                try:
                    chunk = os.read(0, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    self.request_stop("the SSH session to the head closed (stdin EOF)")
                    return
                self._last_heartbeat = time.monotonic()
                if STACKS_REQUEST_BYTE in chunk:
                    self._stacks_requested = True
                    self._wake.set()

        threading.Thread(target=watch, name="stdin-watch", daemon=True).start()

    def _check_heartbeat(self) -> None:
        if not self.options.watch_stdin:
            return
        silent = time.monotonic() - self._last_heartbeat
        if silent > self.options.heartbeat_timeout:
            self.request_stop(f"no heartbeat from the head for {silent:.0f}s (link lost?)")

    # -- where is each rank: stacks and hangs ---------------------------------------------------

    def _live_targets(self) -> list[Target]:
        return [Target(rank=w.plan.rank, pid=w.proc.pid, stacks_file=w.plan.env.get(STACKS_FILE_ENV, ""))
                for w in self._workers if w.proc.poll() is None and w.plan.env.get(STACKS_FILE_ENV)]

    def dump_stacks(self, why: str) -> StacksReport | None:
        """Every live worker's stack, grouped on stderr, in full under the run dir."""
        targets = self._live_targets()
        if not targets:
            return None
        report = build_report(collect(targets), self.topology.host)
        path, problem = None, None
        try:
            path = write_stacks_report(report.full_text, self.options.run_dir) if self.options.run_dir else None
        except OSError as exc:  # a full log disk must not turn a diagnosis into a crash
            problem = exc.strerror or type(exc).__name__
        lines = [stacks_block_title(len(targets), self.topology.host, why)]
        lines.extend(f"  {line}" for line in report.lines)
        if path:
            lines.append(f"  full dump: {path}")
        if problem:
            lines.append(f"  full dump not written: {problem}")
        self._say("\n".join(lines))
        if self.options.report_json:
            waiting = sorted(r for r, w in report.where.items() if w.in_collective)
            self._sink().say(stacks_line(self.topology.host, why, report.summaries(), waiting, path), stderr=False)
        return report

    def _check_hang(self) -> None:
        timeout = self.options.hang_timeout
        if not timeout:
            return
        lives = [RankLife(w.plan.rank, w.output.last_line_at, w.plan.env.get(HEARTBEAT_FILE_ENV))
                 for w in self._workers if w.exit is None]
        progress = last_progress(lives, since=self._attempt_started)
        now = time.monotonic()
        if self._first_life is None and (any(t is not None for t in progress.values())
                                         or any(w.exit is not None or w.output.last_line_at for w in self._workers)):
            self._first_life = now
        # The clock starts at the job's first sign of life (a line, a heartbeat, or a rank's
        # exit), so importing torch on a busy node is never a hang; from then on a rank that
        # never printed counts from that moment: a silent rank left alone by peers that
        # exited (even silently) does not wait forever.
        stalled = stalled_for(progress, now, since=self._first_life)
        if stalled is None or stalled <= timeout:
            return
        report = self.dump_stacks("hang")
        self._hang = True
        self.request_stop(f"hang: no rank made progress for {stalled:.0f}s (hang_timeout {timeout:g}s); "
                          + culprit(progress, report.where if report else {}))

    def _write_launcher_file(self) -> None:
        """logs/<run-id>/launcher.json lets ``clusterddp stacks`` find this launcher.

        Not for a launcher started by the SSH head (--watch-stdin): the head owns that file,
        and on a shared filesystem every host would overwrite it.
        """
        if not self.options.run_dir or self.options.watch_stdin:
            return
        write_launcher_file(self.options.run_dir, self.topology.host, self.topology.run_id,
                            [p.rank for p in self.plans])
