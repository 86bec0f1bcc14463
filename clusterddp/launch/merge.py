"""Identical console lines from several ranks, printed within a short window, shown as one.

64 ranks printing the same warning used to give 64 console lines that bury everything else;
now they give one, ``[host ranks 0-63] UserWarning: ...`` (``[ranks 0-63]`` on the SSH head
when the ranks are on several hosts). Only the console: every rank's log file keeps every line.

How a line travels:

- it is held at most ``WINDOW`` seconds, waiting for its twins from other ranks; a group that
  every expected rank joined goes out at once, so a warning all ranks print costs no wait;
- lines go out in the order they came, a group at the place of its first line; a rank's line
  joins a group only where that keeps each rank's own order on each stream: a group younger
  than every line of that rank still held, or else a group that is the latest held line of
  each of its ranks, which moves to the back (rank 1's ``loss`` line, then ``epoch done``,
  joins rank 0's ``epoch done`` held before it); a group that every rank joined takes out
  the lines ahead of it;
- a line only one rank printed goes out as it would without merging, label and all, at most
  ``WINDOW`` later; with one rank to show (``expected`` 1) nothing is held at all;
- at most ``MAX_HELD_BYTES`` are held: a flood of distinct lines pushes the oldest out early.

The merger holds whole lines as shown (masked, escaped) and knows nothing of labels: the
caller's ``render`` writes the label of a group's sources. One daemon thread per merger
releases what is due; writing happens under the merger's lock, so a caller that writes a line
of its own calls ``flush`` first and its line comes after every worker line before it.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from clusterddp.stackreport import format_ranks

#: Seconds a console line waits for the same line from other ranks. Ranks that print the same
#: warning do it within milliseconds of each other once running (a step, a shared code path);
#: 16 ranks starting on 2 busy cores spread their import-time warnings over about as much.
WINDOW = 0.5
#: Bytes of lines held at once; beyond it the oldest go out early (a flood stays bounded).
MAX_HELD_BYTES = 1 << 20

#: (host, ranks) that printed a line: one rank from a worker, several from a merged line.
Source = tuple[str, tuple[int, ...]]
#: (stderr, the line as shown without its newline, its sources) -> the bytes to write.
Render = Callable[[bool, bytes, Sequence[Source]], bytes]
#: (bytes, stderr): the console's write.
Write = Callable[[bytes, bool], None]


@dataclass
class _Held:
    seq: int
    stderr: bool
    text: bytes
    deadline: float
    sources: list[Source] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)


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
        #: Held groups by seq, in the order they go out.
        self._queue: dict[int, _Held] = {}
        self._by_text: dict[tuple[bool, bytes], list[_Held]] = {}
        #: Per (rank, stderr): the seq of its latest line still held.
        self._last: dict[tuple[int, bool], int] = {}
        #: Groups moved to the back: due (their first line's deadline) before those ahead.
        self._moved: list[_Held] = []
        #: Everything up to this seq goes out (a complete group takes the lines ahead along).
        self._due_upto = 0
        self._seq = 0
        self._held_bytes = 0
        self._thread: threading.Thread | None = None

    def add(self, stderr: bool, host: str, ranks: tuple[int, ...], text: bytes) -> None:
        """One line (without its newline) that ``ranks`` on ``host`` printed."""
        with self._cond:
            group = self._join(stderr, text, ranks)
            if group is None:
                group = _Held(self._next_seq(), stderr, text, self._clock() + self.window)
                self._queue[group.seq] = group
                self._by_text.setdefault((stderr, text), []).append(group)
                self._held_bytes += len(text)
            group.sources.append((host, ranks))
            group.ranks.update(ranks)
            for rank in ranks:
                self._last[(rank, stderr)] = group.seq
            if len(group.ranks) >= self.expected:
                self._due_upto = max(self._due_upto, group.seq)
            self._release(self._clock())
            if self._queue:
                self._wake_thread()

    def flush(self) -> None:
        """Everything held goes out now (before the caller's own line, at the end)."""
        with self._cond:
            self._release(float("inf"))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _join(self, stderr: bool, text: bytes, ranks: tuple[int, ...]) -> _Held | None:
        """A held group of this line that none of ``ranks`` is in yet, where joining keeps
        every rank's order: one younger than every line of ``ranks`` still held, else one that
        is the latest held line of each of its ranks, moved to the back."""
        newest = max((self._last.get((rank, stderr), 0) for rank in ranks), default=0)
        candidates = [group for group in self._by_text.get((stderr, text), ()) if group.ranks.isdisjoint(ranks)]
        for group in candidates:
            if group.seq > newest:
                return group
        for group in candidates:
            if all(self._last.get((rank, stderr)) == group.seq for rank in group.ranks):
                del self._queue[group.seq]
                group.seq = self._next_seq()
                self._queue[group.seq] = group
                for rank in group.ranks:
                    self._last[(rank, stderr)] = group.seq
                self._moved.append(group)
                return group
        return None

    def _release(self, now: float) -> None:
        upto = self._due_upto
        for group in self._moved:
            if group.deadline <= now:
                upto = max(upto, group.seq)
        queue = self._queue
        while queue:
            group = queue[next(iter(queue))]
            if group.seq > upto and group.deadline > now and self._held_bytes <= MAX_HELD_BYTES:
                break
            del queue[group.seq]
            self._held_bytes -= len(group.text)
            same = self._by_text[(group.stderr, group.text)]
            same.remove(group)
            if not same:
                del self._by_text[(group.stderr, group.text)]
            self._write(self._render(group.stderr, group.text, group.sources), group.stderr)
        if self._moved:
            self._moved = [group for group in self._moved if group.seq in queue]

    def _next_deadline(self) -> float:
        return min([self._queue[next(iter(self._queue))].deadline] + [group.deadline for group in self._moved])

    def _wake_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-merge", daemon=True)
            self._thread.start()
        else:
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._queue:
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
