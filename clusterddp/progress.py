"""The launcher's view of every rank's progress file: read it, and judge a group of them.

Each worker's ``clusterddp.train.heartbeat()`` rewrites its heartbeat file with one JSON
record (format in ``clusterddp/train/liveness.py``); the file's mtime is the hang detector's
sign of life (``clusterddp.hang``). This leaf reads the content, tolerating every state a
file can be seen in (absent, empty, half-written, an old record's padding, garbage, a
future version), and offers pure functions over a list of records. Hang detection,
straggler naming, the restart verdict and the goodput report all read records through
here, none keeps a private clock (docs/architecture.md, "One progress file feeds every judgement").
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

#: The record versions this reader understands.
VERSIONS = (1,)
#: The phase of a rank completing steps that announced nothing else.
TRAIN = "train"
#: A record bigger than this is not one (``liveness`` writes ~200 bytes).
MAX_RECORD_BYTES = 4096


@dataclass(frozen=True)
class RankProgress:
    """One rank's record as last written, with the file's mtime (its last sign of life)."""

    rank: int
    #: The last completed step; None before the first.
    step: int | None
    #: Wall time the last step ended; None before the first.
    t: float | None
    #: Steps since the previous record, and their mean wall time (None when not known).
    steps: int
    step_s: float | None
    #: Mean of the rank's own work outside collectives over those steps; None: not measured.
    compute_s: float | None
    phase: str
    #: Wall time the phase began.
    phase_t: float | None
    #: The file's mtime (wall): when the record was last written.
    mtime: float
    #: The last phase that ended, (name, start, end) in wall time; None: none yet.
    last: tuple[str, float, float] | None = None

    @property
    def stepped(self) -> bool:
        """True once the rank has completed a step."""
        return self.step is not None


def read_progress(path: str, rank: int = -1) -> RankProgress | None:
    """The record in ``path``; None when there is none or it cannot be read as one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        mtime = os.fstat(fd).st_mtime
        raw = os.read(fd, MAX_RECORD_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_record(raw, mtime, rank)


def parse_record(raw: bytes, mtime: float, rank: int = -1) -> RankProgress | None:
    """A record from a file's bytes; None for empty, partial, garbage or unknown versions."""
    try:
        data, _ = json.JSONDecoder().raw_decode(raw.decode("utf-8", "strict").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("v") not in VERSIONS:
        return None
    phase = data.get("phase")
    return RankProgress(
        rank=rank, step=_int(data.get("step")), t=_number(data.get("t")),
        steps=_int(data.get("steps")) or 0, step_s=_number(data.get("step_s")),
        compute_s=_number(data.get("compute_s")),
        phase=phase[:64] if isinstance(phase, str) and phase else TRAIN,
        phase_t=_number(data.get("phase_t")), mtime=mtime, last=_last(data.get("last")))


def _last(value: object) -> tuple[str, float, float] | None:
    if not isinstance(value, list) or len(value) != 3 or not isinstance(value[0], str) or not value[0]:
        return None
    began, ended = _number(value[1]), _number(value[2])
    if began is None or ended is None or ended < began:
        return None
    return value[0][:64], began, ended


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if number == number and number >= 0 and number != float("inf") else None


def read_all(paths: Iterable[tuple[int, str]]) -> list[RankProgress]:
    """The records of (rank, path) pairs that have one."""
    records = (read_progress(path, rank) for rank, path in paths)
    return [record for record in records if record is not None]


# -- judgements over a group of records (pure) -------------------------------------------------

def stepped_since(records: Sequence[RankProgress], since: float) -> bool:
    """Did any rank complete a step at or after the wall time ``since`` (an attempt's start)?"""
    return any(r.t is not None and r.t >= since for r in records)


def first_step_t(records: Sequence[RankProgress], since: float) -> float | None:
    """The earliest step end after ``since`` the records show (each shows its last, so this
    is exact only while the first records come in: callers look early and keep the answer)."""
    times = [r.t for r in records if r.t is not None and r.t >= since]
    return min(times) if times else None


def max_step(records: Sequence[RankProgress]) -> int | None:
    """The furthest step any rank completed; None before the first."""
    steps = [r.step for r in records if r.step is not None]
    return max(steps) if steps else None


def in_phase(records: Sequence[RankProgress], phase: str | None = None) -> list[RankProgress]:
    """Ranks in ``phase`` (None: in any phase other than training)."""
    return [r for r in records if (r.phase == phase if phase is not None else r.phase != TRAIN)]


def median(values: Iterable[float | None]) -> float | None:
    """The median of the known values; None when none is known."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def median_compute(records: Sequence[RankProgress]) -> float | None:
    """The median of the ranks' mean compute per step (None: no rank measures it)."""
    return median(r.compute_s for r in records)


def median_step(records: Sequence[RankProgress]) -> float | None:
    """The median of the ranks' mean step wall time (None: not known yet)."""
    return median(r.step_s for r in records)
