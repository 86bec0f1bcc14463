"""The local supervisor: N workers on this node; one fails, all stop; nothing left running.

Follows torch elastic's shape: named states (``states.State``, changed only by
``Lifecycle.enter``) around small parts: one attempt started, watched and torn down
(``attempt.py``, over the worker group of ``start/workers.py``), its end judged
(``restart/judge.py``), the next one in place when whoever restarts the job as a whole says
so (``restart/coordinate.py``), requests from signals and the SSH session (``requests.py``,
``watch.py``), diagnostics as hooks (``diagnostics.py``). What stays here: the loop through
the states, the report naming the host, rank, log and last lines of the first failure, and
the result line for the SSH head.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Callable

from clusterddp.events import EventLog
from clusterddp.launch.observe.logs import ConsoleSink
from clusterddp.launch.observe.peers import shared_run_dir
from clusterddp.launch.observe.runlog import RunLog
from clusterddp.launch.options import RunOptions
from clusterddp.launch.restart.coordinate import AttemptEnded, Coordinator, next_place
from clusterddp.launch.restart.judge import AttemptFacts, Judgement, judge
from clusterddp.launch.restart.policy import AttemptEnd, RestartPolicy, exit_code
from clusterddp.launch.restart.stepcoord import StepCoordinator
from clusterddp.launch.restart.verdict import Failure, rank_ends
from clusterddp.launch.start.node import NodePlan
from clusterddp.launch.start.warm import WarmStart
from clusterddp.launch.start.workers import TEARDOWN_SLACK, WorkerGroup, WorkerPlan
from clusterddp.launch.supervise.attempt import AttemptResult, AttemptRun
from clusterddp.launch.supervise.diagnostics import DiagnosticHooks, default_hooks
from clusterddp.launch.supervise.requests import Requests, signals_handled
from clusterddp.launch.supervise.states import Lifecycle, State
from clusterddp.launch.supervise.telling import Telling
from clusterddp.launch.supervise.watch import StdinWatch
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
    #: Stop when stdin reaches EOF or stays silent this long (the SSH head's keepalive).
    watch_stdin: bool = False
    keepalive_timeout: float = 6.0
    #: Print one machine-readable result line at the end (for the SSH head).
    emit_result: bool = False
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
    #: Under the batch script with whole-job restarts left: the srun step's shared record
    #: directory, where the step's launchers restart in place (``restart/stepcoord.py``).
    step_dir: str | None = None
    #: The job's ``restarts`` (the step's whole-job restarts; ``restarts`` is this node's own).
    job_restarts: int = 0


def supervisor_options(node: NodePlan, options: RunOptions) -> SupervisorOptions:
    """How to supervise this node's workers, from its plan and the run's options."""
    job, topology = node.job, node.topology
    return SupervisorOptions(
        job_name=job.name,
        grace_period=job.grace_period,
        # Restarted as a whole from outside (--restart-count, OpenPAI's job retry): this
        # node alone never restarts, its peers would not come back with it.
        restarts=job.restarts if topology.restart_count is None else 0,
        first_attempt=topology.first_attempt,
        forward_signals=tuple(getattr(signal, name) for name in job.forward_signals),
        console_ranks=frozenset(job.logs.ranks) if job.logs.ranks is not None else None,
        prefix=job.logs.prefix,
        merge=job.logs.merge,
        watch_stdin=options.watch_stdin,
        keepalive_timeout=options.keepalive_timeout,
        emit_result=options.emit_result,
        await_restart=options.await_restart,
        hang_timeout=job.hang_timeout,
        run_dir=node.run_dir,
        restart_on=job.restart_on,
        restarted_outside=topology.restart_count is not None,
        warm_start=node.warm,
        preload=job.preload,
        # Under the batch script (--marks-dir, --restart-count) with restarts left: the
        # launchers of the srun step restart in place (restart/stepcoord.py).
        step_dir=options.marks_dir if topology.restart_count is not None
        and topology.restart_count < job.restarts else None,
        job_restarts=job.restarts,
    )



@dataclass(frozen=True)
class _RunEnd:
    code: int
    last: AttemptResult
    attempts: list[AttemptEnd]


class LocalSupervisor:
    """Runs the workers of this node until they all succeed, one fails, or we are told to stop.

    Built whole here: who decides a whole-job restart in place (``coordinator``: given, the
    srun step's ``StepCoordinator`` when ``options.step_dir`` says so, or the SSH head's word
    on stdin with ``await_restart``; None: this launcher ends with a failed attempt unless its
    own ``restarts`` restart it), and ``relayout``: this node's workers planned for another
    place in the job (a restart in place after an elastic job lost a node)."""

    def __init__(self, topology: Topology, plans: list[WorkerPlan], options: SupervisorOptions,
                 hooks: DiagnosticHooks | None = None, coordinator: Coordinator | None = None,
                 relayout: Callable[[Topology], list[WorkerPlan]] | None = None) -> None:
        self.topology = topology
        self.plans = plans
        self.options = options
        self.relayout = relayout
        self.lifecycle = Lifecycle()
        self.requests = Requests()
        self.console = ConsoleSink(prefix=options.prefix, ranks=options.console_ranks, merge=options.merge)
        self.console.merging([plan.rank for plan in plans])
        warm = WarmStart(options.preload, self.console.say, lambda: self.requests.stopping) \
            if options.warm_start else None
        self.group = WorkerGroup(topology.host, options.grace_period, self.console, warm)
        self.policy = RestartPolicy(options.restarts)
        # events.jsonl when this launcher is the run's only one, else events.node<K>.jsonl
        alone = topology.nnodes == 1 and not options.watch_stdin
        # several nodes, no head: node 0 judges every node's records it sees in the run dir
        peers = shared_run_dir(options.run_dir, topology, options.watch_stdin, self.console.say)
        self.runlog = RunLog(EventLog(options.run_dir, None if alone else topology.node_rank, topology.host),
                             peers=peers)
        self.tell = Telling(options.job_name, self.console, self.runlog, options.run_dir if not options.watch_stdin
                            else None, options.emit_result)
        hooks = hooks or default_hooks(topology.host, options.run_dir, options.hang_timeout, self.console.say,
                                       self.tell.emit if options.emit_result else None, events=self.runlog.events,
                                       records=lambda: self.runlog.judged, peers=peers, alone=alone)
        self._watch = StdinWatch(options.keepalive_timeout, self.requests.stop, self.requests.stacks,
                                 self.requests.end_attempt) if options.watch_stdin else None
        if coordinator is None and options.step_dir is not None:
            coordinator = StepCoordinator(options.step_dir, topology, options.job_restarts, options.restart_on,
                                          options.grace_period + TEARDOWN_SLACK, peers, self.console.say)
        self.coordinator = coordinator if coordinator is not None or not options.await_restart else self._watch
        self.attempt = AttemptRun(self.group, hooks, self.runlog, self.requests, self._watch, self.coordinator,
                                  options.hang_timeout, options.restart_on)
        #: The last attempt's report is out already (printed before waiting for a decision).
        self._reported = False
        #: Did a rank complete a step in the last attempt (sent to the SSH head in the result line).
        self._progressed: bool | None = None

    def run(self) -> int:
        """Supervise to the end and return the launcher's exit code.

        The stop signals are ours from before the first worker to after the last line: one
        that comes while the report is written asks for a stop that is already done, instead
        of killing the launcher by the signal half-way through its report.
        """
        with signals_handled(self.requests, self.options.forward_signals, self.group.signal_workers):
            self.group.open()
            self.tell.launcher_file(self.topology, self.plans)
            self.runlog.events.attempt = self.options.first_attempt  # a whole-job restart's launcher
            self.runlog.emit("run_start", job=self.options.job_name, ranks=[p.rank for p in self.plans],
                             restarts=self.options.restarts, hang_timeout=self.options.hang_timeout)
            if self._watch is not None:
                self._watch.start()
            try:
                end = self._attempts()
            finally:
                self.group.close()
            return self._finish(end)

    # -- the states ----------------------------------------------------------------------------

    def _attempts(self) -> _RunEnd:
        """RUNNING -> STOPPING -> JUDGING, then AWAITING_WORD or BACKING_OFF back to RUNNING,
        until an attempt is the last: it succeeded, the restarts are used up, or we are told
        to stop."""
        attempts: list[AttemptEnd] = []
        previous: Failure | None = None
        while True:
            number = len(attempts)
            began = time.monotonic()
            result = self._run_attempt(number)
            self.lifecycle.enter(State.JUDGING)
            self._progressed = self.runlog.progressed()
            judged = judge(AttemptFacts(number, result.exits, result.root, result.hang, result.peer,
                                        self.requests.stop_reason, self.requests.stop_signal, self._progressed,
                                        previous, self.options.first_attempt),
                           self.policy, self.options.restart_on, self.options.restarted_outside)
            attempts.append(AttemptEnd(number, len(self.plans), self.topology.host, judged.code,
                                       result.cause or (self.requests.stop_reason if judged.code else None),
                                       time.monotonic() - began))
            if judged.said:
                self.console.say(judged.said)
            self.tell.attempt_ended(judged, result, self.requests.stop_reason)
            previous = judged.failure
            if judged.backoff is None and result.failed and self._told_to_restart(number, judged, result):
                continue
            if judged.backoff is None:
                return _RunEnd(judged.code, result, attempts)
            self.console.say(f"clusterddp: {result.cause}; restarting the local group in {judged.backoff:.0f}s "
                             f"(restart {number + 1} of {self.options.restarts})")
            self.lifecycle.enter(State.BACKING_OFF)
            if self._pause(judged.backoff):
                signum = self.requests.stop_signal
                name = signal.Signals(signum).name if signum else None
                self.console.say(f"clusterddp: {name or self.requests.stop_reason} before the restart: not restarting")
                # Stopped while nothing ran: the launcher's own stop decides the code (128+N).
                return _RunEnd(exit_code(None, [], False, signum), result, attempts)

    def _run_attempt(self, number: int) -> AttemptResult:
        """RUNNING until the attempt ends, then STOPPING: its workers torn down, whatever happened."""
        self.lifecycle.enter(State.RUNNING)
        root = None
        try:
            attempt = self.options.first_attempt + number
            self.attempt.start(self.plans, attempt, number < self.options.restarts or self.options.restarted_outside)
            root = self.attempt.watch_until_end()
        finally:
            self.lifecycle.enter(State.STOPPING)
            result = self.attempt.teardown(root)
        return result

    def _told_to_restart(self, number: int, judged: Judgement, result: AttemptResult) -> bool:
        """AWAITING_WORD: ask the coordinator (if any) whether the whole job restarts in place;
        True: the plans are the next attempt's, run it now.

        The attempt's report goes out first, and for the SSH head its result line, marked
        waiting: the decision needs every node's, so it must not wait for a node's last line."""
        if self.coordinator is None or self.requests.stopping:
            return False
        self.lifecycle.enter(State.AWAITING_WORD)
        attempt = self.options.first_attempt + number
        reason = result.hang or result.peer
        self.tell.report(judged.code, result, reason)
        self._reported = True
        self.tell.result_line(judged.code, self.topology.host, result, reason, self._progressed,
                              waiting_after=attempt)
        told = self.coordinator.next_attempt(
            AttemptEnded(attempt, judged.code, result.root, judged.failure, bool(self._progressed), result.hang,
                         tuple(rank_ends(result.exits))),
            lambda: self.requests.stopping)
        if told is None or self.requests.stopping:
            return False
        if told.attempt != attempt + 1:
            raise RuntimeError(f"told to run attempt {told.attempt} after attempt {attempt}")
        try:
            self.topology, self.plans = next_place(self.topology, self.plans, told, self.relayout)
        except ValueError as exc:
            self.console.say(f"clusterddp: not running attempt {told.attempt} as node {told.node_rank}: {exc}")
            return False
        self._reported = False
        if told.node_rank is None:
            self.runlog.emit("restart", backoff_s=0.0, in_place=True, master_port=told.master_port)
            return True
        self.tell.launcher_file(self.topology, self.plans)
        self.runlog.emit("restart", backoff_s=0.0, in_place=True, master_port=told.master_port,
                         node_rank=told.node_rank, nnodes=self.topology.nnodes,
                         ranks=[plan.rank for plan in self.plans], world_size=self.topology.world_size)
        return True

    def _pause(self, seconds: float) -> bool:
        """BACKING_OFF: wait out the backoff before a restart; True when told to stop meanwhile
        (at once). Whatever else wakes the loop (the SIGCHLD of the workers just torn down, a
        stacks request, answered by the next attempt's ranks) does not shorten the wait."""
        deadline = time.monotonic() + seconds
        while not self.requests.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._watch is not None:
                self._watch.check()
            self.requests.nap(min(left, 0.5))
        return True

    def _finish(self, end: _RunEnd) -> int:
        """FINISHED: the report (unless out already), the attempts, the result line, run_end."""
        self.lifecycle.enter(State.FINISHED)
        last, code = end.last, end.code
        reason = last.hang or last.peer or self.requests.stop_reason
        if not self._reported:
            self.tell.report(code, last, reason)
        if len(end.attempts) > 1 and not self.options.restarted_outside:  # else whoever restarts lists them
            self.console.say(f"clusterddp: {len(end.attempts)} attempts:")
            for attempt in end.attempts:
                self.console.say(f"clusterddp:   {attempt.line()}")
        self.tell.result_line(code, self.topology.host, last, reason, self._progressed)
        self.runlog.emit("run_end", exit_code=code)
        self.runlog.close()
        self.console.settle()
        return code
