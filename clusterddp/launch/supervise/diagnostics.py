"""Where is each rank: stacks on request, the hang check and the slow host, as hooks the
supervisor calls.

The supervisor owns none of this logic: on its tick it hands the hooks the state of its
ranks (``workers.RankState``, plain data) and acts on what they answer (a stop reason).
The hang hook also reads the ranks' progress files (at most every ``READ_INTERVAL``, and
only when something judges them: ``hang_timeout: auto``, the straggler check) and hands the
same records to every judgement: one read feeds them all.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from clusterddp.atomicfile import WriteError
from clusterddp.events import EventLog
from clusterddp.hang import (AUTO, PHASE_BUDGET, START_BUDGET, WORK_BUDGET, RankLife, StepBudget, culprit,
                             last_progress, stalled_for, stuck, unannounced_work, work_line)
from clusterddp.progress import RankProgress, read_all
from clusterddp.straggler import StragglerWatch
from clusterddp.launch.observe.peers import SharedRunDir
from clusterddp.launch.supervise.stackdump import Target, collect
from clusterddp.launch.start.workers import RankState
from clusterddp.protocol import progress_line, stacks_block_title, stacks_line, write_stacks_report
from clusterddp.stackreport import StacksReport, build_report

StacksHook = Callable[[Sequence[RankState], str], "StacksReport | None"]
#: A judgement fed this node's ranks' progress files each time they are read.
RecordsHook = Callable[[list[RankProgress]], None]
#: Seconds between two reads of the records (a rank rewrites its record at most once a second).
READ_INTERVAL = 0.5


@dataclass(frozen=True)
class DiagnosticHooks:
    """What the supervisor calls; built by ``default_hooks``, replaced freely in tests."""

    #: Dump the stacks of the live ranks; ``why``: "requested" or "hang". None: nothing to dump.
    stacks: StacksHook
    #: On every tick: a stop reason when no rank made progress for too long, else None.
    hang: Callable[[Sequence[RankState]], str | None]
    #: At the start of every attempt (the hang clock starts again).
    new_attempt: Callable[[], None]


class StacksDump:
    """Every live rank's stack, grouped on stderr, in full under the run dir."""

    def __init__(self, host: str, run_dir: str | None, say: Callable[[str], None],
                 emit: Callable[[str], None] | None = None) -> None:
        self.host = host
        self.run_dir = run_dir
        self._say = say
        #: Where the machine-readable stacks line goes (stdout, for the SSH head); None: nowhere.
        self._emit = emit

    def __call__(self, ranks: Sequence[RankState], why: str) -> StacksReport | None:
        report = self.look(ranks)
        if report is not None:
            self.show(report, why)
        return report

    def look(self, ranks: Sequence[RankState]) -> StacksReport | None:
        """The live ranks' stacks, read and grouped, shown nowhere (the hang check's question
        "does any rank wait in a collective?" needs an answer, not a report)."""
        targets = [Target(rank=r.rank, pid=r.pid, stacks_file=r.stacks_file or "")
                   for r in ranks if r.running and r.stacks_file]
        if not targets:
            return None
        return build_report(collect(targets), self.host)

    def show(self, report: StacksReport, why: str) -> None:
        """The report on stderr, in full under the run dir, and as a stacks line (``emit``)."""
        path, problem = None, None
        try:
            path = write_stacks_report(report.full_text, self.run_dir) if self.run_dir else None
        except WriteError as exc:  # a full log disk must not turn a diagnosis into a crash
            problem = exc.strerror
        lines = [stacks_block_title(len(report.where), self.host, why)]
        lines.extend(f"  {line}" for line in report.lines)
        if path:
            lines.append(f"  full dump: {path}")
        if problem:
            lines.append(f"  full dump not written: {problem}")
        self._say("\n".join(lines))
        if self._emit is not None:
            waiting = sorted(r for r, w in report.where.items() if w.in_collective)
            self._emit(stacks_line(self.host, why, report.summaries(), waiting, path))


@dataclass(frozen=True)
class StallLook:
    """How ``hang_timeout: auto`` looks at a stall before it calls it a hang (``hang.unannounced_work``):
    the stacks read quietly, shown only when it is one; the line and event when it is work."""

    look: Callable[[Sequence[RankState]], StacksReport | None]
    show: Callable[[StacksReport, str], None]
    say: Callable[[str], None]
    events: EventLog | None = None


class HangCheck:
    """No rank made progress for ``timeout`` seconds: dump, name a culprit.

    A number: progress is any sign of life (a line, the heartbeat file's mtime), counted from
    the attempt's first one. ``"auto"``: ``hang.StepBudget`` over the progress files; before
    the attempt's first step ``hang.START_BUDGET`` without any sign of life, counted from the
    attempt's start; after it, no step (nor phase change) on any rank for the budget.

    With ``peers`` (no head, several nodes): node 0's records include the other nodes' it
    sees, so their phases count; a node K that node 0 judges leaves the verdict after its
    first step to node 0 (alone it would take node 0's checkpoint for a hang), keeping only
    ``PHASE_BUDGET`` as a backstop.

    When the auto budget runs out, the stacks say whether it is a hang (``hang.unannounced_work``):
    if no rank waits in a collective, the stretch since the last step is work nobody announced
    and may last ``hang.WORK_BUDGET``; the next step (or phase change) ends it."""

    def __init__(self, timeout: float | str | None, stacks: StacksHook,
                 clock: Callable[[], float] = time.monotonic, host: str = "",
                 judges: Sequence[RecordsHook] = (), wall: Callable[[], float] = time.time,
                 records: Callable[[], list[RankProgress]] | None = None,
                 peers: SharedRunDir | None = None, stall: StallLook | None = None, alone: bool = False) -> None:
        self.timeout = timeout
        #: This node runs every rank of the job (one node, no head): ``hang.stuck`` may say so.
        self._alone = alone
        self._stacks = stacks
        self._stall = stall or StallLook(look=lambda ranks: stacks(ranks, "hang"), show=lambda report, why: None,
                                         say=lambda line: None)
        #: The last step (or phase change, wall time) of a stall found to be work: the stretch
        #: that carries ``WORK_BUDGET`` until the next one. None: no such stretch now.
        self._work_from: float | None = None
        self._work_said = False
        self._clock = clock
        self._wall = wall
        self._host = host
        self._judges = tuple(judges)
        self._attempt_started = clock()
        self._attempt_wall = wall()
        #: monotonic time of the attempt's first sign of life (None: every rank still starting)
        self._first_life: float | None = None
        self._budget = StepBudget()
        self._records: list[RankProgress] = []
        self._next_read = 0.0
        #: The supervisor's reader of the records (``runlog.RunLog.records``): one read feeds
        #: the event log and every judgement here. None: read them here (tests, other callers).
        self._source = records
        self._peers = peers

    def new_attempt(self) -> None:
        self._attempt_started = self._clock()
        self._attempt_wall = self._wall()
        self._first_life = None
        self._work_from, self._work_said = None, False
        self._budget.new_attempt()
        self._records = []

    def __call__(self, ranks: Sequence[RankState]) -> str | None:
        if self.timeout == AUTO or self._judges:
            self._read(ranks)
        timeout = self.timeout
        if not timeout:
            return None
        if timeout == AUTO:
            return self._auto(ranks)
        assert isinstance(timeout, (int, float))
        lives = [RankLife(r.rank, r.last_line_at, r.heartbeat_file) for r in ranks if not r.exited]
        progress = last_progress(lives, since=self._attempt_started)
        now = self._clock()
        if self._first_life is None and (any(t is not None for t in progress.values())
                                         or any(r.exited or r.last_line_at for r in ranks)):
            self._first_life = now
        # The clock starts at the job's first sign of life (a line, a heartbeat, or a rank's
        # exit), so importing torch on a busy node is never a hang; from then on a rank that
        # never printed counts from that moment: a silent rank left alone by peers that
        # exited (even silently) does not wait forever.
        stalled = stalled_for(progress, now, since=self._first_life)
        if stalled is None or stalled <= timeout:
            return None
        report = self._stacks(ranks, "hang")
        return (f"hang: no rank made progress for {stalled:.0f}s (hang_timeout {timeout:g}s); "
                + culprit(progress, report.where if report else {}))

    def _read(self, ranks: Sequence[RankState]) -> None:
        if self._source is not None:
            records = self._source()
            if records is self._records:
                return  # not read again since
            self._records = records
        else:
            now = self._clock()
            if now < self._next_read:
                return
            self._next_read = now + READ_INTERVAL
            paths = [(r.rank, r.heartbeat_file) for r in ranks if not r.exited and r.heartbeat_file]
            self._records = [record for record in read_all((rank, path) for rank, path in paths if path)
                             if record.mtime >= self._attempt_wall - 1.0]
        self._budget.observe(self._records)
        for judge in self._judges:
            judge(self._records)

    def _auto(self, ranks: Sequence[RankState]) -> str | None:
        records = self._records
        now_wall = self._wall()
        latest: float | None = None
        if not any(r.t is not None and r.t >= self._attempt_wall - 1.0 for r in records):
            lives = [RankLife(r.rank, r.last_line_at, r.heartbeat_file) for r in ranks if not r.exited]
            progress = last_progress(lives, since=self._attempt_started)
            stalled = stalled_for(progress, self._clock(), since=self._attempt_started)
            budget, how = START_BUDGET, "start-up budget, before the first step"
        else:
            latest = max(max(r.t or 0.0, r.phase_t or 0.0) for r in records)
            stalled = now_wall - latest
            budget, how = self._budget.budget([r.phase for r in records])
            if self._peers is not None and self._peers.judged_elsewhere and budget < PHASE_BUDGET:
                # node 0 judges these ranks with every node's phases; this node keeps only a
                # backstop (a stuck rank here outlives node 0's verdict where nothing kills it)
                budget, how = PHASE_BUDGET, f"node 0 judges every node; here {PHASE_BUDGET:g}s"
            if self._work_from == latest and budget < WORK_BUDGET:
                budget, how = WORK_BUDGET, f"no rank waited in a collective at {budget:.0f}s: unannounced work"
        if stalled is None or stalled <= budget:
            return None
        report = self._stall.look(ranks)
        if latest is not None and budget < WORK_BUDGET and report is not None and unannounced_work(report.where):
            self._work_found(latest, stalled, report)
            return None
        if report is not None:
            self._stall.show(report, "hang")
        hosts = self._peers.hosts if self._peers is not None else {}
        return (f"hang: no step on any rank for {stalled:.0f}s (hang_timeout auto: {budget:.0f}s, {how}); "
                + stuck(records, report.where if report else {}, self._host, now_wall, hosts, self._alone))

    def _work_found(self, latest: float, stalled: float, report: StacksReport) -> None:
        """A stall with no rank in a collective: ``WORK_BUDGET`` for it, one line (the first
        time in the attempt; a script evaluating every epoch would repeat it) and an event."""
        self._work_from = latest
        if not self._work_said:
            self._work_said = True
            self._stall.say("clusterddp: " + work_line(stalled, report.where, self._host, WORK_BUDGET))
        if self._stall.events is not None:
            self._stall.events.emit("unannounced_work", stalled_s=round(stalled, 1), allowed_s=WORK_BUDGET,
                                    ranks={str(rank): w.summary for rank, w in sorted(report.where.items())})


class Stragglers:
    """This node's ranks compared (``straggler.StragglerWatch``): one line and one event per
    slow host found. Under SSH the head judges every host's ranks instead (``ProgressRelay``);
    with ``peers`` node 0 judges every node's it sees, and a node it judges judges nothing."""

    def __init__(self, host: str, say: Callable[[str], None], events: EventLog | None,
                 peers: SharedRunDir | None = None) -> None:
        self._host = host
        self._say = say
        self._events = events
        self._peers = peers
        self._watch = StragglerWatch()

    def __call__(self, records: list[RankProgress]) -> None:
        hosts = self._peers.hosts if self._peers is not None else {}
        if self._peers is not None and self._peers.judged_elsewhere:
            return
        for found in self._watch.observe(records, {r.rank: hosts.get(r.rank, self._host) for r in records}):
            self._say(f"clusterddp: {found.line()}")
            if self._events is not None:
                self._events.emit("straggler", slow_host=found.host, ranks=list(found.ranks),
                                  ratio=round(found.ratio, 2), basis=found.basis)


class ProgressRelay:
    """Under the SSH head: the records that changed, as one ``CLUSTERDDP_PROGRESS`` line."""

    def __init__(self, host: str, emit: Callable[[str], None]) -> None:
        self._host = host
        self._emit = emit
        self._sent: dict[int, tuple[float | None, str, float | None]] = {}

    def __call__(self, records: list[RankProgress]) -> None:
        changed = []
        for record in records:
            key = (record.t, record.phase, record.phase_t)
            if self._sent.get(record.rank) != key:
                self._sent[record.rank] = key
                changed.append((record.rank, record.mtime, json.dumps(record_json(record))))
        if changed:
            self._emit(progress_line(self._host, changed))


def record_json(record: RankProgress) -> dict[str, object]:
    """The record as the rank wrote it (``clusterddp/train/liveness.py``), for the head."""
    return {"v": 1, "step": record.step, "t": record.t, "steps": record.steps, "step_s": record.step_s,
            "compute_s": record.compute_s, "phase": record.phase, "phase_t": record.phase_t}


def default_hooks(host: str, run_dir: str | None, hang_timeout: float | str | None, say: Callable[[str], None],
                  emit: Callable[[str], None] | None, events: EventLog | None = None,
                  records: Callable[[], list[RankProgress]] | None = None,
                  peers: SharedRunDir | None = None, alone: bool = False) -> DiagnosticHooks:
    """Stacks to stderr (and ``emit``), full dumps under ``run_dir``; the hang check on them;
    the slow host named here (its event to ``events``), or under the SSH head (``emit``) by
    the head from every host's records, or without a head by node 0 from every node's it sees
    (``peers``); ``records``: the supervisor's reader of them; ``alone``: this node runs every
    rank of the job."""
    stacks = StacksDump(host, run_dir, say, emit)
    judge: RecordsHook = ProgressRelay(host, emit) if emit is not None else Stragglers(host, say, events, peers)
    stall = StallLook(look=stacks.look, show=stacks.show, say=say, events=events)
    hang = HangCheck(hang_timeout, stacks, host=host, judges=(judge,), records=records, peers=peers, stall=stall,
                     alone=alone)
    return DiagnosticHooks(stacks=stacks, hang=hang, new_attempt=hang.new_attempt)
