"""What a node's supervisor writes to the run's event log, and what it learns from its ranks'
progress files: one object the supervisor calls at a few points of its loop.

It reads the records of the attempt's ranks (``clusterddp.progress``) at most every
``READ_INTERVAL`` seconds on the supervisor's tick, and turns what changed into events
(``clusterddp.events``): the attempt's first completed step, and the phases the ranks
announce (one ``phase`` start when the first rank of this node enters one, one end when the
last leaves it, at the ranks' own times; a ``span`` for one that began and ended between two
reads, from the ranks' ``last`` phase). ``progressed()`` answers the restart verdict's
question "did any step complete in this attempt?" from the same records. On node 0 of a
run whose nodes share the run directory (``peers.SharedRunDir``) the same read takes the
other nodes' records too (``judged``), for the judgements; the events stay this node's.

Two more facts for ``clusterddp report``: ``run_start`` carries ``process_start``, when this
launcher process began (from /proc: the interpreter's own start-up counts against the run,
as it does on the user's clock), and a restarted attempt that runs again steps an earlier
attempt already ran (it resumed from a checkpoint older than the failure) gets one ``redone``
event: from its first step ``at`` to ``until``, the moment its steps passed the highest step
number any earlier attempt reached (estimated from the record's step time; ``caught_up``
false when the attempt ended first). Step numbers are the ranks' own (``fit`` numbers steps
across epochs and resumes), so this needs no knowledge of the checkpoint.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from clusterddp.events import EventLog
from clusterddp.launch.observe.peers import SharedRunDir
from clusterddp.progress import TRAIN, RankProgress, first_step_t, read_all, stepped_since

#: Seconds between two reads of the ranks' records (a read is one small file per rank).
READ_INTERVAL = 0.25
#: An attempt whose ranks wrote no progress file at all (a script that never calls
#: ``heartbeat``) counts as having made progress once it ran this long: without a record
#: the launcher cannot see steps, and a run that failed after hours of unseen work must be
#: restarted as before, not judged "before any progress".
UNSEEN_PROGRESS_AFTER = 60.0


class RunLog:
    """The event log of this launcher and the progress of its current attempt."""

    def __init__(self, events: EventLog, clock: Callable[[], float] = time.time,
                 peers: SharedRunDir | None = None) -> None:
        self.events = events
        self.peers = peers
        self._clock = clock
        self._files: list[tuple[int, str]] = []
        self._own: set[int] = set()
        self._began = 0.0
        self._next_read = 0.0
        self._first_step: float | None = None
        #: phase name -> ranks of this node in it (as last read)
        self._phases: dict[str, set[int]] = {}
        #: phase name -> the end (wall) of its last occurrence in the event log
        self._ended: dict[str, float] = {}
        #: The records last read (the current attempt's ranks that wrote one).
        self.records: list[RankProgress] = []
        #: What the judgements read: ``records`` and, on node 0, the other nodes' it sees.
        self.judged: list[RankProgress] = []
        #: The highest step of earlier attempts, and of this one; this one's lowest.
        self._high: int | None = None
        self._attempt_high: int | None = None
        self._attempt_low: int | None = None
        self._redone_told = False

    def emit(self, kind: str, **fields: Any) -> None:
        if kind == "run_start":
            fields.setdefault("process_start", process_start_time())
        self.events.emit(kind, **fields)

    def attempt_started(self, attempt: int, files: Sequence[tuple[int, str | None]]) -> None:
        """A new attempt: its number stamps later events; its ranks' (rank, heartbeat file)."""
        self.events.attempt = attempt
        if self._attempt_high is not None:
            self._high = max(self._high if self._high is not None else -1, self._attempt_high)
        self._attempt_high = self._attempt_low = None
        self._redone_told = False
        self._files = [(rank, path) for rank, path in files if path]
        self._own = {rank for rank, _ in self._files}
        self._began = self._clock()
        self._next_read = 0.0
        self._first_step = None
        self._phases = {}
        self._ended = {}
        self.records = []
        self.judged = []
        if self.peers is not None:
            self.peers.attempt_started(attempt, self._files)
        self.emit("attempt_start", ranks=len(files))

    def tick(self, force: bool = False) -> None:
        """Read the records if ``READ_INTERVAL`` has passed; emit what changed."""
        now = time.monotonic()
        if not force and now < self._next_read:
            return
        self._next_read = now + READ_INTERVAL
        others: list[tuple[int, str]] = []
        if self.peers is not None:
            self.peers.poll(self._first_step is not None)
            others = self.peers.files
        judged = [r for r in read_all(self._files + others) if r.mtime >= self._began]  # not a stale one
        records = [r for r in judged if r.rank in self._own] if others else judged
        self.records, self.judged = records, judged
        self._redone(records)
        if self._first_step is None:
            first = first_step_t(records, self._began)
            if first is not None:
                self._first_step = first
                self.emit("first_step", at=first, ranks=sorted(r.rank for r in records if r.stepped))
        self._phase_events(records)

    def _redone(self, records: list[RankProgress], ended: bool = False) -> None:
        """Track this attempt's step numbers; emit ``redone`` once it passes earlier attempts'."""
        stepped = [r for r in records if r.step is not None and r.t is not None]
        if stepped:
            top = max(stepped, key=lambda r: r.step or 0)
            low = min(r.step for r in stepped if r.step is not None)
            self._attempt_low = low if self._attempt_low is None else min(self._attempt_low, low)
            self._attempt_high = max(self._attempt_high if self._attempt_high is not None else -1,
                                     top.step or 0)
        if self._high is None or self._redone_told or self._first_step is None or not stepped:
            return
        if top.step is not None and top.t is not None and top.step >= self._high:
            until = top.t - (top.step - self._high) * (top.step_s or 0.0)
            self._tell_redone(max(self._first_step, until), True)
        elif ended:
            self._tell_redone(max(r.t or 0.0 for r in stepped), False)

    def _tell_redone(self, until: float, caught_up: bool) -> None:
        self._redone_told = True
        resumed = (self._attempt_low or 1) - 1
        if resumed >= (self._high or 0):
            return  # nothing run twice (a checkpoint at the failure itself)
        self.emit("redone", at=self._first_step, until=round(until, 3), resumed_after=resumed,
                  earlier_high=self._high, caught_up=caught_up)

    def _phase_events(self, records: list[RankProgress]) -> None:
        now: dict[str, set[int]] = {}
        started: dict[str, float] = {}
        for record in records:
            if record.phase != TRAIN:
                now.setdefault(record.phase, set()).add(record.rank)
                if record.phase_t is not None:
                    started[record.phase] = min(started.get(record.phase, record.phase_t), record.phase_t)
        for name in sorted(now.keys() - self._phases.keys()):
            self.emit("phase", name=name, edge="start", at=started.get(name), ranks=sorted(now[name]))
        for name in sorted(self._phases.keys() - now.keys()):
            left = [t for t in (_left_at(r, name) for r in records if r.rank in self._phases[name])
                    if t is not None]
            ended = max(left) if left else time.time()
            self._ended[name] = ended
            self.emit("phase", name=name, edge="end", at=ended, ranks=sorted(self._phases[name]))
        self._phases = now
        for record in records:  # phases that began and ended between two reads
            if record.last is None:
                continue
            name, began, ended = record.last
            if name in now or began <= self._ended.get(name, float("-inf")):
                continue  # open, or an occurrence already logged (another rank's share of it)
            self._ended[name] = ended
            self.emit("phase", name=name, edge="span", at=began, until=ended, ranks=[record.rank])

    def progressed(self) -> bool:
        """Did any rank of this node complete a step in the current attempt? (Without any
        record from its ranks: did it run ``UNSEEN_PROGRESS_AFTER`` seconds?)"""
        self.tick(force=True)
        if not self.records and self._files:
            return self._clock() - self._began >= UNSEEN_PROGRESS_AFTER
        return self._first_step is not None or stepped_since(self.records, self._began)

    def attempt_ended(self) -> None:
        """Close the phases still open (their ranks are gone)."""
        self.tick(force=True)
        self._redone(self.records, ended=True)
        for name in sorted(self._phases):
            self.emit("phase", name=name, edge="end", at=None, ranks=sorted(self._phases[name]))
        self._phases = {}

    def close(self) -> None:
        self.events.close()


def _left_at(record: RankProgress, name: str) -> float | None:
    """When the rank left phase ``name``: the end of its last phase if that was it (it may
    have entered another since), else the start of the phase it is in now."""
    if record.last is not None and record.last[0] == name:
        return record.last[2]
    return record.phase_t


def process_start_time(pid: int | None = None) -> float | None:
    """Wall time the process started (this one by default), from /proc; None where unknown.

    /proc/PID/stat's field 22 is the start in clock ticks after boot, on the clock
    ``CLOCK_BOOTTIME`` reads; its age subtracted from the wall clock now gives the start to a
    tick (10 ms). (/proc/stat's ``btime`` is whole seconds: up to 1 s off.)
    """
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return round(time.time() - age, 3)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
