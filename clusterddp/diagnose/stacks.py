"""Read the stack dumps workers write (faulthandler format) and say where each rank is.

64 full stacks are noise; what a user needs is "ranks 0-6,8-63: in all_reduce at
train.py:88; rank 7: in DataLoader.__next__". So ranks are grouped by identical main-thread
stack, each group gets one line naming the innermost frame and the innermost frame in the
user's own code, and ranks that are *not* inside a collective are flagged: when everyone
else waits in all_reduce, the odd one out is the likely cause of a hang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')
#: Frames of the worker bootstrap are the same in every rank and say nothing.
_BOOTSTRAP = "clusterddp/launch/bootstrap.py"
#: Functions of torch.distributed (and DDP's reducer) where a healthy rank waits for others.
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "wait", "recv", "send",
    "_sync_params_and_buffers", "_verify_param_shape_across_processes",
})


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    @property
    def short(self) -> str:
        return f"{self.func} ({self.file.rsplit('/', 1)[-1]}:{self.line})"

    @property
    def is_library(self) -> bool:
        return "/site-packages/" in self.file or "/lib/python3" in self.file or self.file.startswith("<")


@dataclass
class ThreadStack:
    thread: str
    current: bool
    frames: list[Frame] = field(default_factory=list)  # innermost first, as faulthandler prints


def parse_dump(text: str) -> list[ThreadStack]:
    """Threads of one faulthandler dump (``all_threads=True``)."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            threads.append(ThreadStack(thread=header.group(2), current=header.group(1) == "Current thread"))
            continue
        frame = _FRAME.match(line)
        if frame and threads and not frame.group("file").endswith(_BOOTSTRAP):
            threads[-1].frames.append(Frame(frame.group("file"), int(frame.group("line")), frame.group("func")))
    return threads


def main_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The thread running the script: its outermost frame is module level of a non-library file."""
    for thread in threads:
        if thread.frames and thread.frames[-1].func == "<module>" and not thread.frames[-1].is_library:
            return thread
    return threads[-1] if threads else None


@dataclass(frozen=True)
class RankWhere:
    """Where one rank is, in one line, plus whether it waits in a collective."""

    summary: str
    key: tuple[Frame, ...]
    in_collective: bool


def locate(dump: str) -> RankWhere:
    """Summarise the main thread of one rank's dump."""
    thread = main_thread(parse_dump(dump))
    if thread is None or not thread.frames:
        return RankWhere(summary="no stack received (the worker may be inside C code holding the GIL)",
                         key=(), in_collective=False)
    innermost = thread.frames[0]
    user = next((f for f in thread.frames if not f.is_library), None)
    summary = f"in {innermost.short}"
    if user is not None and user is not innermost:
        summary += f" <- {user.short}"
    in_collective = any(f.func in COLLECTIVES and f.is_library for f in thread.frames[:6])
    return RankWhere(summary=summary, key=tuple(thread.frames), in_collective=in_collective)


def format_ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    parts: list[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0] if ordered else 0
    for rank in ordered[1:] + [None]:  # type: ignore[list-item]
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ",".join(parts)


def group_report(where: dict[int, RankWhere]) -> list[str]:
    """One line per group of ranks with identical stacks, odd ones (not in a collective) first."""
    groups: dict[tuple[Frame, ...], list[int]] = {}
    for rank, w in where.items():
        groups.setdefault(w.key, []).append(rank)
    lines = []
    ordered = sorted(groups.items(), key=lambda kv: (where[kv[1][0]].in_collective, min(kv[1])))
    waiting = any(w.in_collective for w in where.values())
    for key, ranks in ordered:
        w = where[ranks[0]]
        label = "rank" if len(ranks) == 1 else "ranks"
        flag = "" if w.in_collective or not waiting else "   <- not in a collective: likely holding the others"
        lines.append(f"{label} {format_ranks(ranks)}: {w.summary}{flag}")
    return lines
