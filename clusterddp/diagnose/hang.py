"""Is the job hung, and who is holding it? Pure functions over progress times and stacks.

Progress is any sign of life of a rank: a line printed, or ``clusterddp.train.heartbeat()``
touching its file. The clock starts at the first sign of life of any rank, so start-up
(importing torch, preparing data) never counts as a hang; from then on a rank silent since
then counts as stalled from that moment.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Mapping

from clusterddp.diagnose.stacks import RankWhere, format_ranks


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


def stalled_for(progress: Mapping[int, float | None], now: float) -> float | None:
    """Seconds since any rank last made progress; None before the first sign of life."""
    seen = [t for t in progress.values() if t is not None]
    if not seen:
        return None
    return now - max(seen)


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
