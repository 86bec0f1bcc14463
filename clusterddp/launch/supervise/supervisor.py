"""The local supervisor: N workers on this node; one fails, all stop; nothing left running.

Follows torch elastic's shape and wires small parts together: a worker group
(``workers.py``: start, poll, teardown of N processes, each in its own process group, trees,
orphans and the job's cgroup reaped, done at most grace_period + TEARDOWN_SLACK after the
first SIGTERM), the restart policy around it (``restart/policy.py``), the SSH session's stdin and
heartbeat (``watch.py``), and diagnostics (stacks, hang) as hooks (``diagnostics.py``).
What stays here: the loop, signals turned into an orderly stop (the workers get the signal
the launcher got, Ctrl-C as SIGINT: ``protocol.worker_stop_signal``), the report naming the
host, rank, log and last lines of the first failure, and the result line for the SSH head.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from clusterddp.events import EventLog
from clusterddp.launch.restart.coordinate import AttemptEnded, Coordinator, PeerWatch, relaid, replanned
from clusterddp.launch.supervise.diagnostics import DiagnosticHooks, default_hooks
from clusterddp.launch.observe.logs import ConsoleSink
from clusterddp.launch.observe.peers import shared_run_dir
from clusterddp.launch.observe.report import WorkerExit, format_report
from clusterddp.launch.restart.policy import AttemptEnd, RestartPolicy, end_reason, exit_code
from clusterddp.launch.observe.runlog import RunLog
from clusterddp.launch.restart.verdict import VERDICT_WINDOW, Failure, failure_of, rank_ends, verdict, will_repeat
from clusterddp.launch.supervise.waker import Waker
from clusterddp.launch.start.warm import WarmStart
from clusterddp.launch.supervise.watch import StdinWatch
from clusterddp.launch.start.workers import WorkerGroup, WorkerPlan
from clusterddp.protocol import (STACKS_REQUEST_SIGNAL, STOP_SIGNALS, result_line, worker_stop_signal,
                                 write_launcher_file)
from clusterddp.spec import RestartOnSpec
from clusterddp.topology import Topology


@dataclass(frozen=True)
class SupervisorOptions:
    """How to supervise; filled from the job file and CLI flags."""

    job_name: str
    grace_period: float = 5.0
    restarts: int = 0
    #: The attempt number of the first start (its workers' TORCHELASTIC_RESTART_COUNT): the
    #: attempt of a job restarted as a whole by the SSH head or the batch script
    #: (``--restart-count``); each local restart adds one. Passed to the worker group as is.
    first_attempt: int = 0
    forward_signals: tuple[int, ...] = (signal.SIGUSR1, signal.SIGUSR2)
    console_ranks: frozenset[int] | None = None
    prefix: bool = True
    #: Identical console lines of several ranks shown once (logs.merge).
    merge: bool = True
    #: Stop when stdin reaches EOF or stays silent this long (the SSH head's heartbeat).
    watch_stdin: bool = False
    heartbeat_timeout: float = 6.0
    #: Print one machine-readable result line at the end (for the SSH head).
    report_json: bool = False
    #: After a failed attempt, report it and wait for the head's word on stdin (restart in
    #: place, or end): ``StdinWatch`` is the coordinator when none is given (``--await-restart``).
    await_restart: bool = False
    #: Tear down with exitcodes.HANG when no rank made progress for this long (seconds), or
    #: "auto" (a budget learnt from the steps: ``hang.StepBudget``).
    hang_timeout: float | str | None = None
    #: logs/<run-id>: where launcher.json, stack dumps and the event log go.
    run_dir: str | None = None
    #: Which failures ``restarts`` retries (launch/restart/verdict.py).
    restart_on: RestartOnSpec = RestartOnSpec()
    #: The job is restarted as a whole from outside (the SSH head, the batch script,
    #: OpenPAI): this node's events say that the restart is not its decision.
    restarted_outside: bool = False
    #: Fork the workers from a warm interpreter (warm.py; the job's ``warm_start`` applied).
    warm_start: bool = False
    preload: tuple[str, ...] = ()


class LocalSupervisor:
    """Runs the workers of this node until they all succeed, one fails, or we are told to stop."""

    def __init__(self, topology: Topology, plans: list[WorkerPlan], options: SupervisorOptions,
                 hooks: DiagnosticHooks | None = None, coordinator: Coordinator | None = None) -> None:
        self.topology = topology
        #: Who decides a whole-job restart in place (coordinate.py); None: this launcher ends
        #: with a failed attempt unless its own ``restarts`` restart it.
        self.coordinator = coordinator
        self.plans = plans
        #: This node's workers for another place in the job (a restart in place after an
        #: elastic job lost a node: new ranks, world size, logs): set by whoever planned them.
        self.relayout: Callable[[Topology], list[WorkerPlan]] | None = None
        self.options = options
        self.console = ConsoleSink(prefix=options.prefix, ranks=options.console_ranks, merge=options.merge)
        self.console.merging([plan.rank for plan in plans])
        warm = WarmStart(options.preload, self.console.say, lambda: self._stop_reason is not None) \
            if options.warm_start else None
        self.group = WorkerGroup(topology.host, options.grace_period, self.console, warm)
        self.policy = RestartPolicy(options.restarts)
        # events.jsonl when this launcher is the run's only one, else events.node<K>.jsonl
        alone = topology.nnodes == 1 and not options.watch_stdin
        # several nodes, no head: node 0 judges every node's records it sees in the run dir
        peers = shared_run_dir(options.run_dir, topology, options.watch_stdin, self.console.say)
        self.runlog = RunLog(EventLog(options.run_dir, None if alone else topology.node_rank, topology.host),
                             peers=peers)
        self.hooks = hooks or default_hooks(topology.host, options.run_dir, options.hang_timeout,
                                            self.console.say, self._emit if options.report_json else None,
                                            events=self.runlog.events, records=lambda: self.runlog.judged,
                                            peers=peers, alone=alone)
        self._watch = StdinWatch(options.heartbeat_timeout, self.request_stop, self._request_stacks,
                                 self.end_attempt) if options.watch_stdin else None
        if coordinator is None and options.await_restart:
            self.coordinator = self._watch
        self._wake = Waker()  # set by signal handlers: see waker.py for why not an Event
        self._stop_reason: str | None = None
        self._stop_signal: int | None = None
        self._stacks_requested = False
        #: The attempt whose end was asked for (``end_attempt``), and why; kept until another
        #: is asked for, so a word that came early still ends its attempt and a late one none.
        self._end_requested: tuple[int, str] | None = None
        #: The last attempt's report is out already (printed before waiting for a decision).
        self._reported = False
        #: Why the current attempt was found hung (None: it was not); reset by every attempt.
        self._hang_reason: str | None = None
        #: Why the current attempt ended because another node's did (coordinate.PeerWatch).
        self._peer_reason: str | None = None
        #: Did a rank complete a step in the last attempt (the verdict's input, also sent to
        #: the SSH head in the result line); None: no attempt ended yet.
        self._progressed: bool | None = None
        #: The running attempt may be followed by a restart (by us or whoever restarts nodes).
        self._may_restart = False

    def run(self) -> int:
        """Supervise to the end and return the launcher's exit code.

        The stop signals are ours from before the first worker to after the last line: one
        that comes while the report is written asks for a stop that is already done, instead
        of killing the launcher by the signal half-way through its report.
        """
        previous = self._install_signal_handlers()
        try:
            return self._run_all()
        finally:
            self._restore_signal_handlers(previous)

    def _run_all(self) -> int:
        self.group.open()
        self._write_launcher_file()
        self.runlog.events.attempt = self.options.first_attempt  # a whole-job restart's launcher
        self.runlog.emit("run_start", job=self.options.job_name, ranks=[p.rank for p in self.plans],
                         restarts=self.options.restarts, hang_timeout=self.options.hang_timeout)
        if self._watch is not None:
            self._watch.start()
        try:
            code, exits, root, attempts = self._run_with_restarts()
        finally:
            self.group.close()
        reason = self._hang_reason or self._peer_reason or self._stop_reason
        if not self._reported:
            self._report(code, exits, root, reason)
        if len(attempts) > 1 and not self.options.restarted_outside:  # else whoever restarts lists them
            self.console.say(f"clusterddp: {len(attempts)} attempts:")
            for attempt in attempts:
                self.console.say(f"clusterddp:   {attempt.line()}")
        if self.options.report_json:
            self._emit(result_line(code, self.topology.host, root.to_json() if root else None, reason,
                                   self._progressed, ranks=[end.to_json() for end in rank_ends(exits)]))
        self.runlog.emit("run_end", exit_code=code)
        self.runlog.close()
        self.console.settle()
        return code

    def request_stop(self, reason: str, signum: int | None = None) -> None:
        """Ask the run loop to tear everything down (safe from signal handlers and threads)."""
        if self._stop_reason is None:
            self._stop_reason = reason
            self._stop_signal = signum
        self._wake.set()

    def end_attempt(self, attempt: int, reason: str) -> None:
        """Ask the run loop to end attempt ``attempt`` as a failure (safe from threads): its
        workers are torn down, the launcher stays, and the coordinator decides what comes next.
        A whole-job restart's other nodes are told so when one node failed."""
        self._end_requested = (attempt, reason)
        self._wake.set()

    def _report(self, code: int, exits: list[WorkerExit], root: WorkerExit | None, reason: str | None) -> None:
        report = format_report(self.options.job_name, exits, root, reason if code != 0 else None)
        if report:
            self.console.say(report)

    def _emit(self, line: str) -> None:
        """A machine-readable line on stdout, for the SSH head."""
        self.console.machine(line)

    def _request_stacks(self) -> None:
        self._stacks_requested = True
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------------

    def _run_with_restarts(self) -> tuple[int, list[WorkerExit], WorkerExit | None, list[AttemptEnd]]:
        """Attempts until one succeeds, the restarts are used up, or we are told to stop.

        A failure is a worker's non-zero exit or a hang (exit 124): both are restarted, as the
        SSH head restarts the whole job after either.
        """
        attempts: list[AttemptEnd] = []
        previous: Failure | None = None
        while True:
            number = len(attempts)
            began = time.monotonic()
            exits, root = self._run_once(number)
            failed = root is not None or self._hang_reason is not None or self._peer_reason is not None
            code = self._code(root, exits) if failed or self._stop_reason is not None else 0
            cause = self._hang_reason or self._peer_reason or (
                f"rank {root.rank} on {root.host} {root.outcome()}" if root else None)
            attempts.append(AttemptEnd(number, len(self.plans), self.topology.host, code,
                                       cause or (self._stop_reason if code else None), time.monotonic() - began))
            backoff = self.policy.backoff(number, code if failed else None, stopping=self._stop_reason is not None)
            # an attempt ended because another node's did failed elsewhere: nothing here to judge
            failure = failure_of(code, root.signal_name if root else None, root.tail if root else (),
                                 hang=self._hang_reason is not None) if failed and not self._peer_reason else None
            self._progressed = self.runlog.progressed()
            repeat, spared = verdict(failure, bool(self._progressed), previous,
                                     self.options.first_attempt + number - 1 if previous else None,
                                     self.options.restart_on, rank_ends(exits)) if failure else (None, None)
            if backoff is not None and repeat:
                self.console.say(f"clusterddp: not restarting: {repeat}")
                backoff = None
            elif backoff is not None and spared:
                self.console.say(f"clusterddp: restarting: {spared}")
            why = repeat or end_reason(self.policy, number, code if failed else None, self._stop_reason)
            if spared and backoff is not None:
                why = f"{spared}: restarting"
            if failed and self.options.restarted_outside and self._stop_reason is None:
                why = "whole-job restarts are decided by whoever started the nodes"
            self._attempt_ended(code, cause, failure, root, backoff, why)
            previous = failure
            if backoff is None and failed and self._told_to_restart(number, code, exits, root, failure):
                continue
            if backoff is None:
                return code, exits, root, attempts
            self.console.say(f"clusterddp: {cause}; restarting the local group in {backoff:.0f}s "
                             f"(restart {number + 1} of {self.options.restarts})")
            if self._pause(backoff):
                name = signal.Signals(self._stop_signal).name if self._stop_signal else None
                self.console.say(f"clusterddp: {name or self._stop_reason} before the restart: not restarting")
                # Stopped while nothing ran: the launcher's own stop decides the code (128+N).
                return exit_code(None, [], False, self._stop_signal), exits, root, attempts

    def _told_to_restart(self, number: int, code: int, exits: list[WorkerExit], root: WorkerExit | None,
                         failure: Failure | None) -> bool:
        """Ask the coordinator (if any) whether the whole job restarts in place; True: the
        plans are the next attempt's, run it now.

        The attempt's report goes out first, and for the SSH head its result line, marked
        waiting: the decision needs every node's, so it must not wait for a node's last line."""
        if self.coordinator is None or self._stop_reason is not None:
            return False
        attempt = self.options.first_attempt + number
        reason = self._hang_reason or self._peer_reason
        self._report(code, exits, root, reason)
        self._reported = True
        if self.options.report_json:
            self._emit(result_line(code, self.topology.host, root.to_json() if root else None, reason,
                                   self._progressed, waiting_after=attempt,
                                   ranks=[end.to_json() for end in rank_ends(exits)]))
        told = self.coordinator.next_attempt(
            AttemptEnded(attempt, code, root, failure, bool(self._progressed), self._hang_reason,
                         tuple(rank_ends(exits))),
            lambda: self._stop_reason is not None)
        if told is None or self._stop_reason is not None:
            return False
        if told.attempt != attempt + 1:
            raise RuntimeError(f"told to run attempt {told.attempt} after attempt {attempt}")
        if told.node_rank is None:
            self._reported = False
            self.plans = replanned(self.plans, told.master_port)
            self.runlog.emit("restart", backoff_s=0.0, in_place=True, master_port=told.master_port)
            return True
        try:
            if self.relayout is None:
                raise ValueError("nothing here plans its workers anew")
            moved = relaid(self.topology, told)
        except ValueError as exc:  # a decider of another mind: this launcher ends with the attempt
            self.console.say(f"clusterddp: not running attempt {told.attempt} as node {told.node_rank}: {exc}")
            return False
        self._reported = False
        self.topology = moved
        self.plans = self.relayout(self.topology)
        self._write_launcher_file()
        self.runlog.emit("restart", backoff_s=0.0, in_place=True, master_port=told.master_port,
                         node_rank=told.node_rank, nnodes=self.topology.nnodes,
                         ranks=[plan.rank for plan in self.plans], world_size=self.topology.world_size)
        return True

    def _attempt_ended(self, code: int, cause: str | None, failure: Failure | None, root: WorkerExit | None,
                       backoff: float | None, why: str) -> None:
        """The attempt's end in the event log: its verdict and why; the restart if one follows."""
        self.runlog.attempt_ended()
        self.runlog.events.attempt_ended(code, cause, failure.name() if failure else None,
                                         root.at if root else None, backoff, why, self._stop_reason)

    def _pause(self, seconds: float) -> bool:
        """Wait out the backoff before a restart; True when told to stop meanwhile (at once).

        Whatever else wakes the loop (the SIGCHLD of the workers just torn down, a stacks
        request, answered by the next attempt's ranks) does not shorten the wait.
        """
        deadline = time.monotonic() + seconds
        while self._stop_reason is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._watch is not None:
                self._watch.check()
            self._wake.wait(min(left, 0.5))
            self._wake.clear()
        return True

    def _code(self, root: WorkerExit | None, exits: list[WorkerExit]) -> int:
        return exit_code(root, exits, self._hang_reason is not None, self._stop_signal)

    def _run_once(self, attempt: int) -> tuple[list[WorkerExit], WorkerExit | None]:
        self._hang_reason = self._peer_reason = None
        self._may_restart = attempt < self.options.restarts or self.options.restarted_outside
        self.group.new_attempt()
        self.hooks.new_attempt()
        self.runlog.attempt_started(self.options.first_attempt + attempt,
                                    [(p.rank, p.env.heartbeat_file) for p in self.plans])
        try:
            if self._stop_reason is None and not self._ending():  # all at once: forked back to back
                self.group.start_all(self.plans, self.options.first_attempt + attempt)
            root = self._supervise()
        finally:
            self.group.teardown(patient=self.group.preempted(), signum=worker_stop_signal(self._stop_signal))
        return self.group.exits(), root

    def _supervise(self) -> WorkerExit | None:
        """Wait until all succeed (None) or the first failure (returned) or a stop request."""
        while True:
            cause = self.group.check_reaper()  # its SIGCHLD woke us: replaced within ms
            if cause is not None:
                self.request_stop(cause)
            if self._stop_reason is not None or self._hang_reason is not None:
                return None
            if self._ending():  # another node failed: the verdict weighs our ranks too
                self._let_ranks_end()
                return None
            failed = self.group.poll()
            if failed:
                root = min(failed, key=lambda e: e.at)
                if not root.signal_name:  # a killed rank is never deterministic: at once
                    self._let_ranks_end()
                return root
            if self.group.all_exited():
                return None
            if isinstance(self.coordinator, PeerWatch):  # another node's attempt ended: so does ours
                elsewhere = self.coordinator.ended_elsewhere(self.runlog.events.attempt)
                if elsewhere is not None:
                    self.end_attempt(self.runlog.events.attempt, elsewhere)
                    continue
            if self._watch is not None:
                self._watch.check()
            if self._stacks_requested:
                self._stacks_requested = False
                self.hooks.stacks(self.group.states(), "requested")
            self._check_hang()
            self.runlog.tick()
            self.group.adopt_orphans()
            self._wake.wait(0.1)
            self._wake.clear()

    def _let_ranks_end(self) -> None:
        """Before tearing down after a failure that may be deterministic (a worker's own exit
        before any step, here or on another node: its traceback is not read yet), give the
        other ranks up to VERDICT_WINDOW to end by themselves: a bug in the code fails every
        rank within moments of each other, a race between ranks leaves its peers running
        (``verdict.verdict``). Only when a restart could follow; a killed rank, or a fault
        after progress, is torn down at once."""
        if not self._may_restart or self.runlog.progressed() or self.options.restart_on.deterministic:
            return
        deadline = time.monotonic() + VERDICT_WINDOW
        while not self.group.all_exited() and self._stop_reason is None and time.monotonic() < deadline:
            self.group.poll()
            self._wake.wait(0.02)
            self._wake.clear()
        self.group.poll()

    def _ending(self) -> bool:
        """Was the running attempt asked to end (``end_attempt``: the head's end word, or a
        ``PeerWatch`` that saw another node's end)? Then it ends as a failure of another node's."""
        asked = self._end_requested
        if asked is not None and asked[0] == self.runlog.events.attempt:  # the running attempt's number
            self._peer_reason = asked[1]
        return self._peer_reason is not None

    def _check_hang(self) -> None:
        """A hang ends this attempt as a failure (exit 124), to be restarted like any other;
        unlike a stop request, it does not end the launcher."""
        reason = self.hooks.hang(self.group.states())
        if reason is not None:
            self._hang_reason = reason
            self.runlog.emit("hang", why=reason, timeout_s=self.options.hang_timeout)
            self._wake.set()

    # -- signals --------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, self._on_stop_signal)
        for forwarded in self.options.forward_signals:
            previous[forwarded] = signal.signal(forwarded, self._on_forward_signal)
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
        self._request_stacks()

    def _on_forward_signal(self, signum: int, _frame: object) -> None:
        self.group.signal_workers(signum)

    def _write_launcher_file(self) -> None:
        """logs/<run-id>/launcher.json lets ``clusterddp stacks`` find this launcher.

        Not for a launcher started by the SSH head (--watch-stdin): the head owns that file,
        and on a shared filesystem every host would overwrite it.
        """
        if not self.options.run_dir or self.options.watch_stdin:
            return
        write_launcher_file(self.options.run_dir, self.topology.host, self.topology.run_id,
                            [p.rank for p in self.plans])
