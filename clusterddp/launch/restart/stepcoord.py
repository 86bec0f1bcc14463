"""Restarts in place under SLURM: the launchers of one srun step decide together, node 0 decides.

The batch script restarts a failed step as a new srun step: new launchers, a new zygote that
imports torch again, seconds per fault. But the launchers of a step outlive their workers'
failure, and they share a directory: the step's record directory (``--marks-dir``, made
empty by the batch shell for every step, read by it on node 0, so on a filesystem the nodes
share). So when the job has restarts left, each node's launcher, once its attempt K failed
(or once it saw that another node's attempt K ended: it then tears its own workers down at
once instead of waiting for gloo to notice), writes ``attempt<K>.node<R>.end`` there: when
its first worker failed, the failure, whether its ranks progressed. Node 0 waits for every
node's end (bounded), names the node that failed first as the root cause, applies the
restart verdict (``verdict.will_repeat``, with the previous attempt's failure) and the
budget (``restarts``, the same one the batch script counts), and writes
``attempt<K>.decision``: restart K+1 on a new master port, or stop and why. The others poll
for it (``POLL`` s) and act; the next attempt's workers are forked from the zygote each
launcher already has.

When it cannot be done in place, every launcher ends as before and the batch script's loop
decides: a node node 0 does not see in the run directory (``peers.SharedRunDir``), a node
that does not see node 0's acknowledgement, a node whose end does not come in time (its
launcher died: srun's ``--kill-on-bad-exit`` ends the step anyway), exit 65 or 75. For the
script each launcher also leaves ``node<R>.failure``: ``T_MS ATTEMPT restart|stop TEXT``, the
wall time of its first failure in ms, the attempt, and the verdict; the script takes the
earliest record as the root cause, stops on ``stop`` with TEXT as the reason, and counts
restarts from ATTEMPT, and from ``node<R>.attempt``, the attempt a launcher restarted in place
runs. Every name carries the attempt, and the directory is per step: a file
of an earlier attempt, step or requeued run never counts.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

from clusterddp import exitcodes, protocol
from clusterddp.atomicfile import WriteError, write_atomically
from clusterddp.launch.restart.coordinate import AttemptEnded, Restart
from clusterddp.launch.observe.peers import SharedRunDir
from clusterddp.launch.restart.verdict import Failure, RankEnd, verdict
from clusterddp.spec import RestartOnSpec
from clusterddp.topology import Topology, free_port
from clusterddp.validate import read_json_object

#: Seconds between two looks for the decision (nodes K) or for the nodes' ends (node 0).
POLL = 0.02
#: Seconds node 0 waits for the other nodes' ends beyond their teardown (grace_period + the
#: worker group's slack): a node that has not reported by then is taken as lost.
END_WAIT_SLACK = 3.0
#: Seconds a node K waits for the decision beyond node 0's own wait.
DECISION_WAIT_SLACK = 2.0
#: A record larger than this is not one.
MAX_BYTES = 64 << 10
#: Exit codes a restart in place never follows: the batch script treats them (requeue, stop).
NOT_IN_PLACE = (exitcodes.PREEMPTED, exitcodes.NONFINITE_LOSS)


@dataclass(frozen=True)
class NodeEnd:
    """One node's attempt end, as written to the record directory."""

    node: int
    host: str
    #: Wall time of this node's first failed worker; None: it ended because another did.
    failed_at: float | None
    exit_code: int
    failure: Failure | None
    progressed: bool
    #: This node waits for node 0's decision (it saw node 0's acknowledgement).
    waits: bool
    #: How each of this node's ranks ended: node 0 judges a failure from every rank's.
    ranks: tuple[RankEnd, ...] = ()

    def to_json(self) -> str:
        data = asdict(self)
        data["ranks"] = [end.to_json() for end in self.ranks]
        return json.dumps(data)

    @staticmethod
    def from_json(data: Mapping[str, object]) -> NodeEnd | None:
        """The end ``data`` describes; None when it is not one."""
        try:
            failure = data.get("failure")
            failed_at = data.get("failed_at")
            ranks = data.get("ranks")
            read = [RankEnd.from_json(rank) for rank in ranks] if isinstance(ranks, list) else []
            end = NodeEnd(int(data["node"]), str(data["host"]),  # type: ignore[call-overload]
                          float(failed_at) if isinstance(failed_at, (int, float)) else None,
                          int(data["exit_code"]),  # type: ignore[call-overload]
                          Failure(**failure) if isinstance(failure, dict) else None,
                          data.get("progressed") is True, data.get("waits") is True,
                          tuple(rank for rank in read if rank is not None))
        except (KeyError, TypeError, ValueError):
            return None
        return end


@dataclass(frozen=True)
class Decision:
    """Node 0's decision after attempt ``attempt``."""

    attempt: int
    restart: bool
    master_port: int | None
    #: Why not restarted in place (a stop), or the root cause (a restart).
    why: str
    #: The verdict stopped the job: the batch script must not restart it either.
    final: bool = False
    #: The root cause's wall time (the batch script's record orders nodes by it).
    failed_at: float | None = None


class StepCoordinator:
    """This node's side of restarts in place within one srun step (see the module docstring)."""

    def __init__(self, directory: str, topology: Topology, restarts: int, rule: RestartOnSpec,
                 teardown_s: float, peers: SharedRunDir | None, say: Callable[[str], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.topology = topology
        self.restarts = restarts
        self.rule = rule
        self.teardown_s = teardown_s
        self.peers = peers
        self.say = say
        self.clock = clock
        #: node 0: the root cause of the previous attempt decided here (the verdict's input).
        self._previous: tuple[int, Failure | None] | None = None
        self._next_look = 0.0

    @property
    def node(self) -> int:
        return self.topology.node_rank

    # -- during an attempt ----------------------------------------------------------------------

    def ended_elsewhere(self, attempt: int) -> str | None:
        """Another node's attempt ``attempt`` ended: why (this node ends its attempt too);
        None otherwise. Looks at most every ``POLL`` s."""
        now = time.monotonic()
        if now < self._next_look:
            return None
        self._next_look = now + POLL
        try:
            names = os.listdir(self.directory)
        except OSError:
            return None
        for node in range(self.topology.nnodes):
            if node != self.node and protocol.attempt_end_name(attempt, node) in names:
                end = self._end(attempt, node)
                what = end.failure.name() if end and end.failure else "ended"
                return f"node {node} ({end.host if end else '?'}) ended attempt {attempt}: {what}"
        return None

    # -- after it ---------------------------------------------------------------------------------

    def next_attempt(self, ended: AttemptEnded, stopping: Callable[[], bool]) -> Restart | None:
        """Report ``ended``; node 0 decides, the others wait for its decision."""
        failed_at = ended.root.at if ended.root is not None else (self.clock() if ended.hang else None)
        waits = self._waits(ended)
        end = NodeEnd(self.node, self.topology.host, failed_at, ended.exit_code, ended.failure, ended.progressed,
                      waits, ended.ranks)
        self._record(ended.attempt, end, None)
        if not self._write(protocol.attempt_end_name(ended.attempt, self.node), end.to_json()):
            waits = False
        if self.node == 0:
            decision = self._decide(ended, end, stopping)
        elif waits:
            decision = self._wait_decision(ended.attempt, stopping)
        else:
            return None
        if decision is None:
            return None
        if decision.final:
            self._record(ended.attempt, end, decision)
        if not decision.restart:
            if self.node == 0 and not decision.final:  # a final verdict: the batch script says why
                self.say(f"clusterddp: no restart in place after attempt {ended.attempt}: {decision.why}")
            return None
        try:  # the batch script counts restarts on from the last attempt the launchers ran
            protocol.write_mark(self.directory, self.node, protocol.MARK_ATTEMPT, f"{ended.attempt + 1}\n")
        except WriteError as exc:
            self.say(f"clusterddp: warning: --marks-dir: {exc}")
        if self.node == 0:
            self.say(f"clusterddp: attempt {ended.attempt} failed ({decision.why}); restarting in place: attempt "
                     f"{ended.attempt + 1} of {self.restarts}, master port {decision.master_port}")
        return Restart(ended.attempt + 1, decision.master_port)

    def _waits(self, ended: AttemptEnded) -> bool:
        """Does this node take part in a decision in place (else it ends, the script decides)?"""
        if ended.attempt + 1 > self.restarts or ended.exit_code in NOT_IN_PLACE:
            return False
        if self.topology.nnodes == 1:
            return True
        if self.peers is None:
            return False
        return self.peers.sees_all() if self.node == 0 else self.peers.acknowledged()

    def _decide(self, ended: AttemptEnded, mine: NodeEnd, stopping: Callable[[], bool]) -> Decision | None:
        """Node 0: gather every node's end, judge, write the decision (a stop too: the others
        then end at once instead of waiting)."""
        attempt = ended.attempt
        ends = {0: mine}
        if mine.waits:
            deadline = time.monotonic() + self.teardown_s + END_WAIT_SLACK
            while len(ends) < self.topology.nnodes and time.monotonic() < deadline and not stopping():
                for node in range(1, self.topology.nnodes):
                    if node not in ends:
                        found = self._end(attempt, node)
                        if found is not None:
                            ends[node] = found
                if len(ends) < self.topology.nnodes:
                    time.sleep(POLL)
            if stopping():
                return None
        decision = self._judge(ended, ends)
        if not self._write(protocol.decision_name(attempt), json.dumps(asdict(decision))):
            return None
        return decision

    def _judge(self, ended: AttemptEnded, ends: Mapping[int, NodeEnd]) -> Decision:
        attempt = ended.attempt
        failed = [end for end in ends.values() if end.failed_at is not None]
        root = min(failed, key=lambda end: end.failed_at or 0.0) if failed else None
        what = (root.failure.name() if root.failure else f"exit {root.exit_code}") if root else ""
        cause = f"node {root.node} ({root.host}) first: {what}" if root else "no node names a failed worker"
        failed_at = root.failed_at if root else None

        def stop(why: str, final: bool = False) -> Decision:
            return Decision(attempt, False, None, why, final, failed_at)

        if not ends[0].waits:
            if ended.attempt + 1 > self.restarts:
                return stop(f"restarts used up ({self.restarts})")
            if ended.exit_code in NOT_IN_PLACE:
                return stop(f"exit {ended.exit_code}: the batch script decides")
            return stop("node 0 does not see every node in the run directory: the batch script restarts the step")
        lost = [node for node in range(self.topology.nnodes) if node not in ends]
        if lost:
            return stop(f"node(s) {', '.join(map(str, lost))} did not report the attempt's end within "
                        f"{self.teardown_s + END_WAIT_SLACK:.0f}s: the batch script restarts the step")
        progressed = any(end.progressed for end in ends.values())
        previous, self._previous = self._previous, (attempt, root.failure if root else None)
        if root is not None and root.failure is not None:
            before = previous[1] if previous and previous[0] == attempt - 1 else None
            every_rank = [rank for end in ends.values() for rank in end.ranks]
            repeat, spared = verdict(root.failure, progressed, before, attempt - 1 if before else None, self.rule,
                                     every_rank)
            if repeat:
                return stop(f"{repeat} (node {root.node}, {root.host})", final=True)
            if spared:
                self.say(f"clusterddp: restarting: {spared} (node {root.node}, {root.host})")
        absent = [end.node for end in ends.values() if not end.waits]
        if absent:  # it did not see node 0's acknowledgement yet: it has ended, the step with it
            return stop(f"node(s) {', '.join(map(str, absent))} do not wait for node 0: the batch script decides")
        return Decision(attempt, True, free_port(""), cause, False, failed_at)  # node 0 runs rank 0

    def _wait_decision(self, attempt: int, stopping: Callable[[], bool]) -> Decision | None:
        """Node K: poll for node 0's decision; None when it does not come in time."""
        deadline = time.monotonic() + self.teardown_s + END_WAIT_SLACK + DECISION_WAIT_SLACK
        path = os.path.join(self.directory, protocol.decision_name(attempt))
        while time.monotonic() < deadline and not stopping():
            data = read_json_object(path, MAX_BYTES)
            if data is not None:
                return _decision(data, attempt)
            time.sleep(POLL)
        if not stopping():
            self.say(f"clusterddp: no decision from node 0 after attempt {attempt}: the batch script decides")
        return None

    # -- files --------------------------------------------------------------------------------------

    def _end(self, attempt: int, node: int) -> NodeEnd | None:
        data = read_json_object(os.path.join(self.directory, protocol.attempt_end_name(attempt, node)), MAX_BYTES)
        end = NodeEnd.from_json(data) if data is not None else None
        return end if end is not None and end.node == node else None

    def _write(self, name: str, text: str) -> bool:
        try:
            write_atomically(os.path.join(self.directory, name), text, durable=False)
        except WriteError as exc:
            self.say(f"clusterddp: warning: --marks-dir: {exc}")
            return False
        return True

    def _record(self, attempt: int, end: NodeEnd, decision: Decision | None) -> None:
        """``node<R>.failure`` for the batch script: the earliest record is the root cause."""
        failed_at = decision.failed_at if decision is not None else end.failed_at
        if failed_at is None:  # ended because another node did: not a cause (nor an earlier attempt's)
            try:
                os.unlink(os.path.join(self.directory, protocol.mark_name(self.node, protocol.MARK_FAILURE)))
            except OSError:
                pass
            return
        if decision is not None and decision.final:
            said, text = "stop", decision.why
        else:
            repeat = verdict(end.failure, end.progressed, None, None, self.rule, end.ranks)[0] if end.failure else None
            said, text = ("stop", repeat) if repeat else ("restart", end.failure.name() if end.failure else "")
        text = " ".join("".join(c for c in text if c.isprintable()).split())  # one line, for a shell's echo
        line = f"{int(failed_at * 1000)} {attempt} {said} {text}\n"
        try:
            protocol.write_mark(self.directory, self.node, protocol.MARK_FAILURE, line)
        except WriteError as exc:
            self.say(f"clusterddp: warning: --marks-dir: {exc}")


def _decision(data: Mapping[str, object], attempt: int) -> Decision | None:
    """The decision ``data`` holds for ``attempt``; None when it is not one (a stop)."""
    port, failed_at, why = data.get("master_port"), data.get("failed_at"), data.get("why")
    if data.get("attempt") != attempt or not isinstance(data.get("restart"), bool) or not isinstance(why, str) \
            or not (port is None or (isinstance(port, int) and 0 < port < 65536)) \
            or not (failed_at is None or isinstance(failed_at, (int, float))):
        return None
    return Decision(attempt, bool(data["restart"]), port, why, data.get("final") is True,
                    float(failed_at) if failed_at is not None else None)
