"""Where each rank is: read the stack dumps workers write (faulthandler format), group them,
and merge every host's answer into one report. Pure functions on text and plain data.

64 full stacks are noise; what a user needs is "ranks 0-6,8-63: in all_reduce at
train.py:88; rank 7: in DataLoader.__next__". So ranks are grouped by identical main-thread
stack, each group gets one line naming the innermost frame and the innermost frame in the
user's own code, and ranks that are *not* inside a collective are flagged: when everyone
else waits in all_reduce, the odd one out is the likely cause of a hang.

Across hosts, each remote launcher answers a stacks request with one ``CLUSTERDDP_STACKS``
line (``protocol.stacks_line``): its host, why it dumped ("requested" or "hang"), one
summary per rank and where it kept the full dump. The head merges those answers by
identical summary, so 64 ranks on 8 hosts read as "ranks 0-6,8-63 (node1..node8): in
all_reduce ..." and "rank 7 (node1): in load_batch ...", with the same rule for the likely
culprit. A leaf: the supervisor (one host) and the SSH head (all hosts) both use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')
#: Frames of the worker bootstrap are the same in every rank and say nothing.
_BOOTSTRAP = "clusterddp/launch/start/bootstrap.py"
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
    for rank in [*ordered[1:], None]:
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


@dataclass
class StacksReport:
    """Grouped summary lines, per-rank locations, and the full text for the log file."""

    lines: list[str]
    where: dict[int, RankWhere]
    full_text: str

    def summaries(self) -> dict[int, str]:
        return {rank: w.summary for rank, w in self.where.items()}


def build_report(dumps: dict[int, str], host: str) -> StacksReport:
    where = {rank: locate(text) for rank, text in dumps.items()}
    lines = group_report(where)
    full = [f"where each rank is on {host}:"] + [f"  {line}" for line in lines] + [""]
    for rank in sorted(dumps):
        full.append(f"===== rank {rank} on {host} =====")
        full.append(dumps[rank].rstrip() or "(no stack received)")
    return StacksReport(lines=lines, where=where, full_text="\n".join(full) + "\n")


# -- across hosts: every host's answer merged (the SSH head) ------------------------------------

#: The innermost frame as ``locate`` writes it: "in all_reduce (distributed_c10d.py:2850) ...".
_INNERMOST = re.compile(r"^in (?P<func>[^ ]+) \((?P<file>[^:)]+):\d+\)")
_LIBRARY_FILES = ("distributed_c10d.py", "c10d_logger.py", "distributed.py")


def summary_in_collective(summary: str) -> bool:
    """Whether a one-line summary says the rank waits inside a torch.distributed collective.

    Used when a host's answer does not list its waiting ranks itself: the summary's
    innermost frame is a collective function of torch.distributed's own files.
    """
    match = _INNERMOST.match(summary)
    return match is not None and match.group("func") in COLLECTIVES and match.group("file") in _LIBRARY_FILES


@dataclass(frozen=True)
class HostStacks:
    """One host's answer to a stacks request."""

    host: str
    why: str
    ranks: Mapping[int, str]
    waiting: frozenset[int]
    full: str | None = None

    @staticmethod
    def from_json(data: Mapping[str, Any], host: str) -> "HostStacks":
        """From a ``CLUSTERDDP_STACKS`` payload; ``host`` is the head's name for the host.

        ``waiting`` (ranks inside a collective) is used when the launcher sends it, else it
        is read off each summary.
        """
        ranks = {int(rank): str(summary) for rank, summary in (data.get("ranks") or {}).items()}
        if isinstance(data.get("waiting"), list):
            waiting = frozenset(int(r) for r in data["waiting"])
        else:
            waiting = frozenset(r for r, s in ranks.items() if summary_in_collective(s))
        return HostStacks(host=host, why=str(data.get("why", "requested")), ranks=ranks, waiting=waiting,
                          full=data.get("full"))


@dataclass
class MergedStacks:
    """Every answering host's ranks, grouped; plus the hosts that did not answer."""

    answers: list[HostStacks]
    missing: list[str] = field(default_factory=list)

    @property
    def where(self) -> dict[int, tuple[str, str]]:
        """rank -> (host, summary)."""
        return {rank: (a.host, summary) for a in self.answers for rank, summary in a.ranks.items()}

    @property
    def waiting(self) -> set[int]:
        return {rank for a in self.answers for rank in a.waiting}

    def suspects(self) -> list[int]:
        """Ranks outside any collective while others wait in one (empty if nobody waits)."""
        waiting = self.waiting
        if not waiting:
            return []
        return sorted(rank for rank in self.where if rank not in waiting)

    def lines(self) -> list[str]:
        """One line per distinct summary, odd ones out first, each naming its ranks and hosts."""
        where = self.where
        waiting = self.waiting
        groups: dict[str, list[int]] = {}
        for rank, (_, summary) in where.items():
            groups.setdefault(summary, []).append(rank)
        ordered = sorted(groups.items(), key=lambda kv: (kv[1][0] in waiting, min(kv[1])))
        lines = []
        for summary, ranks in ordered:
            hosts = sorted({where[r][0] for r in ranks}, key=lambda h: min(r for r in ranks if where[r][0] == h))
            label = "rank" if len(ranks) == 1 else "ranks"
            flag = "" if ranks[0] in waiting or not waiting else "   <- not in a collective: likely holding the others"
            lines.append(f"{label} {format_ranks(ranks)} ({', '.join(hosts)}): {summary}{flag}")
        lines.extend(f"{host}: no answer (its launcher had exited or did not reply in time)" for host in self.missing)
        return lines

    def culprit(self) -> str:
        """The hang message's verdict: who holds the others, or that nobody stands out."""
        suspects = self.suspects()
        if suspects:
            hosts = sorted({self.where[r][0] for r in suspects})
            return (f"rank(s) {format_ranks(suspects)} on {', '.join(hosts)} not in a collective while "
                    f"rank(s) {format_ranks(sorted(self.waiting))} wait in one")
        if not self.where:
            return "no stacks received"
        return "every rank is in the same kind of place; see the stacks"

    def text(self, title: str) -> str:
        """The report as written to ``stacks-*.txt``: summary, then each host's full dump."""
        out = [title] + [f"  {line}" for line in self.lines()]
        out.append("full dumps (all threads), kept on each host:")
        out.extend(f"  {a.host}: {a.full or '(not written)'}" for a in sorted(self.answers, key=_first_rank))
        return "\n".join(out) + "\n"


def _first_rank(answer: HostStacks) -> int:
    return min(answer.ranks, default=1 << 30)


def merge(answers: Sequence[HostStacks], missing: Sequence[str] = ()) -> MergedStacks:
    return MergedStacks(answers=list(answers), missing=list(missing))
