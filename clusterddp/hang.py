"""Is the job hung, and who is holding it? Pure functions over progress times and stacks.

Progress is any sign of life of a rank: a line printed, or ``clusterddp.train.heartbeat()``
touching its file. The clock starts at the job's first sign of life (any rank's line,
heartbeat or exit), so start-up (importing torch, preparing data) never counts as a hang;
from then on the job is stalled for as long as its most recently active live rank has been
silent, and a rank that has shown no life at all counts from that first sign of life: a
silent rank left alone by peers that exited (even silently) is still caught.
A leaf below the supervisor, which runs the check on every tick.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Mapping

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
