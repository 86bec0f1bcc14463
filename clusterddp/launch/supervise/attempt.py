"""One attempt of this node's workers: started together, watched until the first failure, a
hang, another node's end or a stop, then torn down. The supervisor's RUNNING and STOPPING
states; what follows the attempt is not decided here (``restart.judge``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from clusterddp.launch.observe.exits import WorkerExit
from clusterddp.launch.observe.runlog import RunLog
from clusterddp.launch.restart.coordinate import Coordinator, PeerWatch
from clusterddp.launch.restart.verdict import VERDICT_WINDOW
from clusterddp.launch.start.workers import WorkerGroup, WorkerPlan
from clusterddp.launch.supervise.diagnostics import DiagnosticHooks
from clusterddp.launch.supervise.requests import Requests
from clusterddp.launch.supervise.watch import StdinWatch
from clusterddp.protocol import worker_stop_signal
from clusterddp.spec import RestartOnSpec


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended, as the judge reads it."""

    exits: list[WorkerExit]
    #: The first failed worker (None: all succeeded, a hang, another node's end or a stop).
    root: WorkerExit | None
    #: Why the attempt was found hung (exit 124), if it was.
    hang: str | None
    #: Why the attempt ended because another node's did, if it did.
    peer: str | None

    @property
    def failed(self) -> bool:
        return self.root is not None or self.hang is not None or self.peer is not None

    @property
    def cause(self) -> str | None:
        """The attempt's first failure in a few words (None: nothing failed here)."""
        root = self.root
        return self.hang or self.peer or (f"rank {root.rank} on {root.host} {root.outcome()}" if root else None)


class AttemptRun:
    """Starts, watches and tears down one attempt at a time of one worker group."""

    def __init__(self, group: WorkerGroup, hooks: DiagnosticHooks, runlog: RunLog, requests: Requests,
                 watch: StdinWatch | None, coordinator: Coordinator | None, hang_timeout: float | str | None,
                 restart_on: RestartOnSpec) -> None:
        self.group = group
        self.hooks = hooks
        self.runlog = runlog
        self.requests = requests
        self.watch = watch
        self.peers = coordinator if isinstance(coordinator, PeerWatch) else None
        self.hang_timeout = hang_timeout
        self.restart_on = restart_on
        self._hang: str | None = None
        self._peer: str | None = None
        self._may_restart = False

    def start(self, plans: Sequence[WorkerPlan], attempt: int, may_restart: bool) -> None:
        """Attempt ``attempt`` (its workers' TORCHELASTIC_RESTART_COUNT): every worker forked
        back to back, unless a stop or the attempt's end was asked for already."""
        self._hang = self._peer = None
        self._may_restart = may_restart
        self.group.new_attempt()
        self.hooks.new_attempt()
        self.runlog.attempt_started(attempt, [(p.rank, p.env.heartbeat_file) for p in plans])
        if not self.requests.stopping and not self._ending():
            self.group.start_all(plans, attempt)

    def teardown(self, root: WorkerExit | None) -> AttemptResult:
        """Every worker of the attempt ended (the stop signal the launcher got, if any)."""
        self.group.teardown(patient=self.group.preempted(), signum=worker_stop_signal(self.requests.stop_signal))
        return AttemptResult(self.group.exits(), root, self._hang, self._peer)

    def watch_until_end(self) -> WorkerExit | None:
        """Wait until all succeed (None) or the first failure (returned) or a stop request."""
        while True:
            cause = self.group.check_reaper()  # its SIGCHLD woke us: replaced within ms
            if cause is not None:
                self.requests.stop(cause)
            if self.requests.stopping or self._hang is not None:
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
            if self.peers is not None:  # another node's attempt ended: so does ours
                elsewhere = self.peers.ended_elsewhere(self.runlog.events.attempt)
                if elsewhere is not None:
                    self.requests.end_attempt(self.runlog.events.attempt, elsewhere)
                    continue
            if self.watch is not None:
                self.watch.check()
            if self.requests.take_stacks():
                self.hooks.stacks(self.group.states(), "requested")
            self._check_hang()
            self.runlog.tick()
            self.group.adopt_orphans()
            self.requests.nap(0.1)

    def _let_ranks_end(self) -> None:
        """Before tearing down after a failure that may be deterministic (a worker's own exit
        before any step, here or on another node: its traceback is not read yet), give the
        other ranks up to VERDICT_WINDOW to end by themselves: a bug in the code fails every
        rank within moments of each other, a race between ranks leaves its peers running
        (``verdict.verdict``). Only when a restart could follow; a killed rank, or a fault
        after progress, is torn down at once."""
        if not self._may_restart or self.runlog.progressed() or self.restart_on.deterministic:
            return
        deadline = time.monotonic() + VERDICT_WINDOW
        while not self.group.all_exited() and not self.requests.stopping and time.monotonic() < deadline:
            self.group.poll()
            self.requests.nap(0.02)
        self.group.poll()

    def _ending(self) -> bool:
        """Was the running attempt asked to end (``Requests.end_attempt``: the head's end word,
        or a ``PeerWatch`` that saw another node's end)? Then it ends as another node's failure."""
        asked = self.requests.end_requested
        if asked is not None and asked[0] == self.runlog.events.attempt:  # the running attempt's number
            self._peer = asked[1]
        return self._peer is not None

    def _check_hang(self) -> None:
        """A hang ends this attempt as a failure (exit 124), to be restarted like any other;
        unlike a stop request, it does not end the launcher."""
        reason = self.hooks.hang(self.group.states())
        if reason is not None:
            self._hang = reason
            self.runlog.emit("hang", why=reason, timeout_s=self.hang_timeout)
            self.requests.wake.set()
