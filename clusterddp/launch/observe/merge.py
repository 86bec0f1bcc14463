"""Identical console lines from several ranks, printed within a short window, shown as one.

64 ranks printing the same warning used to give 64 console lines that bury everything else;
now they give one, ``[host ranks 0-63] UserWarning: ...`` (``[ranks 0-63]`` on the SSH head
when the ranks are on several hosts). Only the console: every rank's log file keeps every line.

How a line travels:

- it is held at most ``WINDOW`` seconds, waiting for its twins from other ranks; a group that
  every expected rank joined goes out at once, so a warning all ranks print costs no wait;
- held lines form one console order, arrival order where nothing forbids it; each rank's
  lines on each stream keep their order in it. A rank's line joins the oldest held group of
  the same line that it is not in yet and that need not come before one of the rank's own
  held lines: rank 0 printing ``same`` then ``mine 0``, and rank 1 printing ``mine 1`` (held)
  then ``same``, give ``mine 1``, ``[ranks 0-1] same``, ``mine 0``. Where the group sits
  before that line, the lines between are reordered as little as needed (the group and what
  must follow it move behind what must precede the new line: Pearce and Kelly's dynamic
  topological order), so a line that every rank prints and follows with one of its own is
  merged however the ranks' lines interleave. The one group a line cannot join is one that
  some rank's order puts before the line's own rank's earlier line (rank 0 ``a``, ``b``; rank
  1 ``b``, ``a``: rank 0's ``a`` precedes ``[ranks 0-1] b``, which precedes rank 1's ``a``);
  that line starts a group of its own;
- a group goes out at its first line's deadline, or when every expected rank joined it, and
  takes out every line ahead of it in the console order;
- a line only one rank printed goes out as it would without merging, label and all, at most
  ``WINDOW`` later; with one rank to show (``expected`` 1) nothing is held at all;
- at most ``MAX_HELD_BYTES`` are held: a flood of distinct lines pushes the oldest out early;
  the search for a place is bounded too (``SEARCH_LIMIT``): past it, the line is not merged.

The merger holds whole lines as shown (masked, escaped) and knows nothing of labels: the
caller's ``render`` writes the label of a group's sources. One daemon thread per merger
releases what is due; writing happens under the merger's lock, so a caller that writes a line
of its own calls ``flush`` first and its line comes after every worker line before it. The
clock is a parameter, so the order of any interleaving can be tested without sleeping.
"""

from __future__ import annotations

import heapq
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from clusterddp.stackreport import format_ranks

#: Seconds a console line waits for the same line from other ranks. Ranks that print the same
#: warning do it within milliseconds of each other once running (a step, a shared code path);
#: 16 ranks starting on 2 busy cores spread their import-time warnings over about as much.
WINDOW = 0.5
#: Bytes of lines held at once; beyond it the oldest go out early (a flood stays bounded).
MAX_HELD_BYTES = 1 << 20
#: Held lines one ``add`` may visit to find where its line can join a group: a flood of
#: identical lines stays linear; a line that would need more is shown on its own.
SEARCH_LIMIT = 2048

#: (host, ranks) that printed a line: one rank from a worker, several from a merged line.
Source = tuple[str, tuple[int, ...]]
#: (stderr, the line as shown without its newline, its sources) -> the bytes to write.
Render = Callable[[bool, bytes, Sequence[Source]], bytes]
#: (bytes, stderr): the console's write.
Write = Callable[[bytes, bool], None]


@dataclass(eq=False)
class _Held:
    """One held console line and the ranks that printed it.

    ``place`` is its place in the console order; ``before``/``after`` are, per rank, that
    rank's held line just before and just after it on the same stream: the edges the console
    order must respect."""

    place: int
    stderr: bool
    text: bytes
    deadline: float
    sources: list[Source] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    before: dict[int, _Held] = field(default_factory=dict)
    after: dict[int, _Held] = field(default_factory=dict)
    out: bool = False


class LineMerger:
    """Holds, groups and releases one console's worker lines (see the module docstring)."""

    def __init__(self, render: Render, write: Write, expected: int, window: float = WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._render = render
        self._write = write
        #: How many ranks can print to this console: a group of them all goes out at once.
        self.expected = expected
        self.window = window
        self._clock = clock
        self._cond = threading.Condition()
        #: Held groups by place; ``_places`` is a heap of the same places (the first goes next).
        #: Reordering permutes groups among places, so the set of places never changes but by
        #: a new line (a new, last place) or a line going out (the first place).
        self._at: dict[int, _Held] = {}
        self._places: list[int] = []
        #: (deadline, first place, group): released groups stay until their deadline passes.
        self._deadlines: list[tuple[float, int, _Held]] = []
        self._by_text: dict[tuple[bool, bytes], list[_Held]] = {}
        #: Per (rank, stderr): its latest line still held.
        self._last: dict[tuple[int, bool], _Held] = {}
        self._next_place = 0
        self._held_bytes = 0
        self._thread: threading.Thread | None = None

    def add(self, stderr: bool, host: str, ranks: tuple[int, ...], text: bytes) -> None:
        """One line (without its newline) that ``ranks`` on ``host`` printed."""
        with self._cond:
            now = self._clock()
            self._release(now)  # a group past its deadline is out, whoever gets here first
            group = self._join(stderr, text, ranks)
            if group is None:
                self._next_place += 1
                group = _Held(self._next_place, stderr, text, now + self.window)
                self._at[group.place] = group
                heapq.heappush(self._places, group.place)
                heapq.heappush(self._deadlines, (group.deadline, group.place, group))
                self._by_text.setdefault((stderr, text), []).append(group)
                self._held_bytes += len(text)
            for rank in ranks:
                previous = self._last.get((rank, stderr))
                if previous is not None:
                    previous.after[rank] = group
                    group.before[rank] = previous
                self._last[(rank, stderr)] = group
            group.sources.append((host, ranks))
            group.ranks.update(ranks)
            self._release(now, group.place if len(group.ranks) >= self.expected else 0)
            if self._at:
                self._wake_thread()

    def flush(self) -> None:
        """Everything held goes out now (before the caller's own line, at the end)."""
        with self._cond:
            self._release(float("inf"), float("inf"))

    def release_due(self) -> None:
        """What is due by the clock goes out (the thread's work; a caller with a clock of its
        own calls it after moving the clock)."""
        with self._cond:
            self._release(self._clock())

    def _join(self, stderr: bool, text: bytes, ranks: tuple[int, ...]) -> _Held | None:
        """The oldest held group of this line that none of ``ranks`` is in yet and that can
        come after every held line of ``ranks``, reordering the held lines if need be."""
        latest = [line for line in (self._last.get((rank, stderr)) for rank in ranks) if line is not None]
        newest = max((line.place for line in latest), default=0)
        budget = [SEARCH_LIMIT]
        for group in self._by_text.get((stderr, text), ()):
            if not group.ranks.isdisjoint(ranks):
                continue
            if group.place > newest:
                return group
            if budget[0] > 0 and self._move_after(group, [line for line in latest if line.place > group.place],
                                                  budget):
                return group
        return None

    def _move_after(self, group: _Held, lines: list[_Held], budget: list[int]) -> bool:
        """Reorder the held lines so that ``group`` comes after every one of ``lines`` (all
        placed after it), keeping every rank's order; False, nothing moved, where a rank's
        order puts ``group`` before one of them, or the search would pass ``budget``.

        Only places between ``group``'s and the last of ``lines`` change: what must follow
        ``group`` there (``follow``) moves behind what must precede the last of ``lines``
        (``precede``), each keeping its own order, in the places both had."""
        low, high = group.place, max(line.place for line in lines)
        targets = {id(line) for line in lines}
        follow = self._reach([group], lambda line: line.after.values(), lambda line: line.place <= high, budget)
        if follow is None or any(id(line) in targets for line in follow):
            return False
        precede = self._reach(lines, lambda line: line.before.values(), lambda line: line.place >= low, budget)
        if precede is None:
            return False
        moved = sorted(precede, key=lambda line: line.place) + sorted(follow, key=lambda line: line.place)
        for place, line in zip(sorted(line.place for line in moved), moved):
            line.place = place
            self._at[place] = line
        return True

    @staticmethod
    def _reach(start: Sequence[_Held], edges: Callable[[_Held], Iterable[_Held]],
               inside: Callable[[_Held], bool], budget: list[int]) -> list[_Held] | None:
        """Held lines reachable from ``start`` along ``edges`` without leaving ``inside``;
        None once ``budget`` (shared by every search of one line) runs out."""
        stack = list(start)
        seen = {id(line) for line in stack}
        found: list[_Held] = []
        while stack:
            line = stack.pop()
            found.append(line)
            budget[0] -= 1
            if budget[0] < 0:
                return None
            for neighbour in edges(line):
                if id(neighbour) not in seen and inside(neighbour):
                    seen.add(id(neighbour))
                    stack.append(neighbour)
        return found

    def _release(self, now: float, upto: float = 0) -> None:
        """Out goes every group up to the last place of a group due by ``now`` (or ``upto``),
        and the first ones while more than ``MAX_HELD_BYTES`` are held."""
        deadlines = self._deadlines
        while deadlines and (deadlines[0][2].out or deadlines[0][0] <= now):
            _, _, group = heapq.heappop(deadlines)
            if not group.out:
                upto = max(upto, group.place)
        while self._places:
            place = self._places[0]
            if place > upto and self._held_bytes <= MAX_HELD_BYTES:
                break
            heapq.heappop(self._places)
            self._out(self._at.pop(place))

    def _out(self, group: _Held) -> None:
        """Write ``group``: every line that had to precede it is out already (the order)."""
        group.out = True
        self._held_bytes -= len(group.text)
        same = self._by_text[(group.stderr, group.text)]
        same.remove(group)
        if not same:
            del self._by_text[(group.stderr, group.text)]
        for rank, line in group.after.items():
            del line.before[rank]
        for rank in group.ranks:
            if self._last.get((rank, group.stderr)) is group:
                del self._last[(rank, group.stderr)]
        self._write(self._render(group.stderr, group.text, group.sources), group.stderr)

    def _next_deadline(self) -> float:
        while self._deadlines[0][2].out:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0]

    def _wake_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-merge", daemon=True)
            self._thread.start()
        else:
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._at:
                    self._cond.wait()
                    continue
                left = self._next_deadline() - self._clock()
                if left > 0:
                    self._cond.wait(left)
                self._release(self._clock())


def ranks_label(sources: Sequence[Source]) -> str:
    """``host ranks 0-3,7`` for a group on one host, ``ranks 0-15`` across several hosts."""
    hosts = {host for host, _ in sources}
    ranks = sorted({rank for _, group in sources for rank in group})
    word = "rank" if len(ranks) == 1 else "ranks"
    where = f"{next(iter(hosts))} " if len(hosts) == 1 else ""
    return f"{where}{word} {format_ranks(ranks)}"


#: A host launcher's label, as ``ConsoleSink.label`` writes it without colour (over SSH the
#: host's console is a pipe): ``[cdssh1 rank 3] `` or, merged there, ``[cdssh1 ranks 0-3] ``.
_LABEL = re.compile(rb"\[([^\s\[\]]+) ranks? ((?:[0-9]+(?:-[0-9]+)?,)*[0-9]+(?:-[0-9]+)?)\] ")


def parse_label(line: bytes) -> tuple[str, tuple[int, ...], bytes] | None:
    """(host, ranks, the rest without its newline) of a host's relayed worker line; None
    for anything else (the launcher's own messages, unprefixed output)."""
    match = _LABEL.match(line)
    if match is None:
        return None
    ranks: list[int] = []
    for part in match.group(2).split(b","):
        low, _, high = part.partition(b"-")
        first, last = int(low), int(high or low)
        if last < first or last - first > 1 << 16:
            return None
        ranks.extend(range(first, last + 1))
    return match.group(1).decode("utf-8", "replace"), tuple(ranks), line[match.end():].rstrip(b"\n")
