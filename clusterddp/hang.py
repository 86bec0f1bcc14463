"""Is the job hung, and who is holding it? Pure functions over progress times and stacks.

Progress is any sign of life of a rank: a line printed, or ``clusterddp.train.heartbeat()``
touching its file. The clock starts at the job's first sign of life (any rank's line,
heartbeat or exit), so start-up (importing torch, preparing data) never counts as a hang;
from then on the job is stalled for as long as its most recently active live rank has been
silent, and a rank that has shown no life at all counts from that first sign of life: a
silent rank left alone by peers that exited (even silently) is still caught.
A leaf below the supervisor, which runs the check on every tick.

``hang_timeout: auto`` (``StepBudget``) reads the ranks' progress files instead: before an
attempt's first step ``START_BUDGET`` without any sign of life; once steps flow, no *step* on
any rank for max(``FLOOR``, ``FACTOR`` x the p99 step time so far); a rank in an announced
phase (checkpoint, eval, data) gets the phase's budget instead. When that budget runs out,
``unannounced_work`` decides from the ranks' stacks whether it is a hang at all: a distributed
hang has some rank waiting in a collective; when every rank does its own work (a final
evaluation, a save, the interpreter's exit nobody announced) the stretch gets ``WORK_BUDGET``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from clusterddp.progress import TRAIN, RankProgress
from clusterddp.stackreport import RankWhere, format_ranks


@dataclass(frozen=True)
class RankLife:
    """What the supervisor knows of one live rank's activity."""

    rank: int
    #: time.monotonic() of its last printed line; 0 when it printed none yet.
    last_line_at: float
    heartbeat_file: str | None


def last_progress(lives: list[RankLife], since: float) -> dict[int, float | None]:
    """Last sign of life per rank on the monotonic clock (None: none since ``since``)."""
    now_wall, now_mono = time.time(), time.monotonic()
    progress: dict[int, float | None] = {}
    for life in lives:
        last = life.last_line_at or None
        if life.heartbeat_file:
            try:
                beat = now_mono - (now_wall - os.stat(life.heartbeat_file).st_mtime)
            except OSError:
                beat = None
            if beat is not None and beat >= since:
                last = max(last or 0.0, beat)
        progress[life.rank] = last
    return progress


def stalled_for(progress: Mapping[int, float | None], now: float, since: float | None = None) -> float | None:
    """Seconds since any rank last made progress.

    A rank with no sign of life yet counts from ``since`` (the supervisor passes the job's
    first sign of life: a line, a heartbeat or an exit of any rank): otherwise a rank that
    never printed, left alone by peers that exited, would never count as hung. None while
    nothing is known (every rank still starting).
    """
    seen = [t if t is not None else since for t in progress.values()]
    known = [t for t in seen if t is not None]
    if not known:
        return None
    return now - max(known)


def culprit(progress: Mapping[int, float | None], where: Mapping[int, RankWhere]) -> str:
    """Who holds the others: ranks outside a collective while others wait in one; else,
    when every rank here waits, the holder is on another node; else the first to stop."""
    waiting = sorted(r for r, w in where.items() if w.in_collective)
    outside = sorted(r for r, w in where.items() if not w.in_collective)
    if waiting and outside:
        return (f"rank(s) {format_ranks(outside)} not in a collective while rank(s) "
                f"{format_ranks(waiting)} wait in one")
    if waiting and len(waiting) == len(where):
        return f"rank(s) {format_ranks(waiting)} here all wait in a collective: the rank holding them is on another node"
    seen = [t for t in progress.values() if t is not None]
    first_life = min(seen) if seen else 0.0
    last = {rank: (t if t is not None else first_life) for rank, t in progress.items()}
    earliest = min(last.values()) if last else 0.0
    return f"rank(s) {format_ranks(sorted(r for r, t in last.items() if t - earliest < 0.5))} stopped first"


# -- hang_timeout: auto ------------------------------------------------------------------------

#: The job-file value that asks for a budget learnt from the steps.
AUTO = "auto"
#: Once steps flow: never less than this many seconds without a step.
FLOOR = 5.0
#: Once steps flow: this many times the p99 step time so far.
FACTOR = 4.0
#: Before the first step of an attempt (imports, data preparation, rendezvous, compiling):
#: this long without any sign of life, counted from the attempt's start. Torch's own collective
#: timeout is 600 s, so a rendezvous or first collective stuck longer fails on its own anyway.
START_BUDGET = 600.0
#: A phase the helpers announce (checkpoint, eval, data, any name) may last this long, or
#: FACTOR times the longest earlier run of the same phase when that is longer.
PHASE_BUDGET = 600.0
#: A stall in which no rank waits in a collective (every rank does its own work, unannounced:
#: a final evaluation, saving the model, TensorBoard, the interpreter's exit) may last this long,
#: counted from its last step: such a stretch is no distributed hang, and killing a finished run
#: is worse than waiting. A rank stuck alone outside any collective is still caught here.
WORK_BUDGET = START_BUDGET
#: The phase ``clusterddp.train.liveness.ended`` announces once the rank's script has returned
#: (the bootstrap then runs atexit handlers, flushes, exits): its ending, not a stall. As an
#: announced phase it carries ``PHASE_BUDGET``.
EXIT = "exit"
#: p99 from a histogram of buckets this much apart (bounded memory over weeks of steps).
_BUCKET = 1.05


class StepBudget:
    """What ``hang_timeout: auto`` allows, learnt from the ranks' progress files.

    A step sample is the time between two consecutive records of a rank in training (each
    record shows its last step's end, ``t``): exactly one step when the record holds one step,
    an upper bound of its longest step otherwise (records come at most once a second, so with
    fast steps the floor decides). Windows that held a phase are no step samples; the phase's
    own length (from its start to the next phase's start) is remembered per phase name.
    """

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self._count = 0
        self._seen: dict[int, tuple[float | None, str, float | None]] = {}
        self._longest_phase: dict[str, float] = {}

    def new_attempt(self) -> None:
        """The records start again (the step times learnt stay: it is the same job)."""
        self._seen.clear()

    def observe(self, records: Sequence[RankProgress]) -> None:
        for record in records:
            key = (record.t, record.phase, record.phase_t)
            previous = self._seen.get(record.rank)
            if previous == key:
                continue
            self._seen[record.rank] = key
            if previous is None:
                continue
            last_t, last_phase, last_phase_t = previous
            if (record.phase == TRAIN and last_phase == TRAIN and record.t is not None and last_t is not None
                    and record.t > last_t and (record.phase_t or 0.0) <= last_t):
                self._add(record.t - last_t)
            if last_phase != record.phase and last_phase != TRAIN and last_phase_t is not None \
                    and record.phase_t is not None and record.phase_t >= last_phase_t:
                length = record.phase_t - last_phase_t
                self._longest_phase[last_phase] = max(self._longest_phase.get(last_phase, 0.0), length)

    def _add(self, seconds: float) -> None:
        bucket = math.floor(math.log(max(seconds, 1e-6)) / math.log(_BUCKET))
        self._buckets[bucket] = self._buckets.get(bucket, 0) + 1
        self._count += 1

    def p99(self) -> float | None:
        """The 99th percentile of the step samples (within 5%, rounded up); None: no sample."""
        if not self._count:
            return None
        need, total = math.ceil(0.99 * self._count), 0
        for bucket in sorted(self._buckets):
            total += self._buckets[bucket]
            if total >= need:
                return float(_BUCKET ** (bucket + 1))
        return None

    def budget(self, phases: Sequence[str]) -> tuple[float, str]:
        """Seconds without a step allowed now, and how they were found (for the report)."""
        p99 = self.p99()
        seconds = max(FLOOR, FACTOR * p99) if p99 is not None else FLOOR
        how = (f"max({FLOOR:g}s, {FACTOR:g} x p99 step {p99:.2f}s)" if p99 is not None else f"{FLOOR:g}s floor")
        for phase in sorted(set(phases) - {TRAIN}):
            allowed = max(PHASE_BUDGET, FACTOR * self._longest_phase.get(phase, 0.0))
            if allowed > seconds:
                seconds, how = allowed, f"phase {phase}: max({PHASE_BUDGET:g}s, {FACTOR:g} x its longest so far)"
        return seconds, how


def unannounced_work(where: Mapping[int, RankWhere]) -> bool:
    """The rule that tells a hang from work: True when stacks were read and no rank waits in
    a collective. A distributed hang holds some rank in a collective (waiting for one stuck
    elsewhere, or every rank in one that cannot complete); ranks all outside one are doing
    their own work, however long. No stacks at all (none could be read): unknown, so False,
    and the budget decides as it always did."""
    return bool(where) and not any(w.in_collective for w in where.values())


def work_line(stalled: float, where: Mapping[int, RankWhere], host: str, allowed: float) -> str:
    """The one line said when a stall turns out to be work: where the ranks are, what is allowed."""
    groups: dict[str, list[int]] = {}
    for rank, w in where.items():
        groups.setdefault(w.summary, []).append(rank)
    shown = "; ".join(f"rank(s) {format_ranks(ranks)} {summary}" for summary, ranks in
                      sorted(groups.items(), key=lambda kv: min(kv[1]))[:3])
    return (f"no step for {stalled:.0f}s, but no rank on {host} waits in a collective: unannounced work "
            f"(a final evaluation, a save?), not a hang; hang_timeout auto allows it up to {allowed:.0f}s "
            f"({shown})")


def stuck(records: Sequence[RankProgress], where: Mapping[int, RankWhere], host: str, now: float,
          hosts: Mapping[int, str] | None = None, alone: bool = False) -> str:
    """The rank holding the others, its host and its phase: a rank outside a collective while
    others wait in one, else the rank(s) furthest behind (lowest step, then oldest record).

    ``where`` holds this node's ranks' stacks; ``hosts`` the host of each rank of the records
    that is on another node (node 0 judging every node's records): when every rank here waits
    in a collective, the stuck rank is the furthest behind of those. ``alone``: these are all
    the job's ranks, so when all wait, none holds the others: their collectives cannot match."""
    hosts = hosts or {}
    by_rank = {record.rank: record for record in records}
    outside = sorted(r for r, w in where.items() if not w.in_collective)
    elsewhere = [record for record in records if record.rank in hosts and record.rank not in where]
    if where and not outside and not elsewhere:
        phases = sorted({by_rank[r].phase for r in where if r in by_rank}) or ["unknown"]
        holder = ("no rank holds them: their collectives cannot match (different collectives, groups or "
                  "shapes? see the stacks)" if alone else "the stuck rank is on another node")
        return (f"rank(s) {format_ranks(sorted(where))} on {host} all wait in a collective (phase "
                f"{', '.join(phases)}): {holder}")
    if outside and len(outside) < len(where):
        chosen = outside
    elif by_rank:
        pool = elsewhere if where and not outside else list(by_rank.values())
        lowest = min((r.step if r.step is not None else -1, r.mtime) for r in pool)
        chosen = sorted(r.rank for r in pool if (r.step if r.step is not None else -1) == lowest[0])
    else:
        return f"no progress file on {host}"
    parts = []
    for rank in chosen[:4]:
        record = by_rank.get(rank)
        on = hosts.get(rank, host)
        if record is None:
            parts.append(f"rank {rank} on {on} (no progress file)")
            continue
        # Two clocks, each named: how long ago the rank entered its phase ("train" began with
        # the first step, so that is most of the run), and how long it has gone without a step
        # (what makes it stuck). "in phase train for 11s" read as the second and was the first.
        since = f" (entered {now - record.phase_t:.0f}s ago)" if record.phase_t is not None else ""
        if record.step is None:
            step = ", no step yet"
        elif record.t is not None:
            step = f", no step for {max(0.0, now - record.t):.0f}s (last step recorded {record.step})"
        else:
            step = f", last step recorded {record.step}"
        parts.append(f"rank {rank} on {on} in phase {record.phase}{since}{step}")
    more = f" and {len(chosen) - 4} more" if len(chosen) > 4 else ""
    here = f"rank(s) {format_ranks(sorted(where))} on {host} wait in a collective; " if where and not outside else ""
    return here + "stuck: " + "; ".join(parts) + more
