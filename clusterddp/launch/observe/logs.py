"""Worker output: the raw bytes to the rank's log file, visible whole lines to the console.

One reader thread per pipe reads it in chunks (``os.read``, 64 KiB) and never stops reading
until the worker closes it, whatever happens to the log file or the console, because a pipe
nobody drains blocks the worker (and then the whole job) on its next print.

- Lines up to ``LINE_LIMIT`` bytes are never split or mixed with another stream's line, in
  the file or on the console. A longer line streams to the file in pieces as it arrives (its
  bytes unchanged) and is cut on the console with a marker, so memory stays bounded whatever
  a worker prints (a 400 MB line costs the launcher no more than a short one).
- A log file that cannot be written (ENOSPC, EIO, EROFS, any OSError) switches that rank to
  the console only, with one warning; the stderr tail for the report is kept in memory anyway.
- Every line shown (on the console and in the report's last lines) is masked of known secrets
  first (``redact.mask``, a cut line with ``cut=True``), then shown; the log file keeps the raw
  bytes, secrets included.
- On the console, control characters (ESC, so CSI/OSC sequences, BEL, CR, backspace, C1
  controls...) are shown escaped (``\\x1b``), tabs kept: a worker cannot move the cursor, retitle
  the terminal or hide text. The log file keeps the raw bytes.
- A console that went away (``| head``, a closed terminal) is dropped silently: it never stops
  the job nor changes the exit code.
- Identical lines of several ranks within a short window are shown once, ``[host ranks 0-15]
  ...`` (``merge.py``; off with ``--no-merge`` or ``--no-prefix``); the log files keep each.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Deque, Sequence, TextIO

from clusterddp.launch.observe.merge import LineMerger, Source, ranks_label
from clusterddp.redact import mask, scrub
from clusterddp.validate import shown

#: Lines of stderr kept per worker for the root-cause report.
TAIL_LINES = 20
#: Characters of one stderr line kept for the report (a bounded prefix of a longer line).
TAIL_LINE_CHARS = 2000
#: Bytes read from a pipe at once.
CHUNK = 64 << 10
#: Longest line kept whole: unsplit in the file, uncut on the console.
LINE_LIMIT = 64 << 10
_CUT_MARK = b" [... line cut at 64 KiB; the log file has it whole]"
_CUT_MARK_NO_LOG = b" [... line cut at 64 KiB]"

_COLOURS = (b"\033[36m", b"\033[32m", b"\033[33m", b"\033[35m", b"\033[34m", b"\033[31m")
_RESET = b"\033[0m"
#: C0 controls but tab and newline, DEL, and C1 controls (U+0080-U+009F) encoded in UTF-8.
_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def _escape(match: re.Match[bytes]) -> bytes:
    char = match.group()
    if char == b"\r":
        return b"\\r"
    return b"\\x%02x" % (char[-1] if len(char) == 2 else char[0])


def visible(data: bytes) -> bytes:
    """``data`` with every terminal control character shown escaped (tab and newline kept)."""
    return _CONTROL.sub(_escape, data)


def visible_text(text: str) -> str:
    """``visible`` for text (report lines read from a worker's error file or stderr)."""
    return visible(text.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")


def use_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    if "NO_COLOR" in os.environ:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@dataclass
class ConsoleSink:
    """The launcher's stdout/stderr, shared by all reader threads (and the launcher's own
    messages) under one lock; a stream that failed once is not written again."""

    prefix: bool = True
    ranks: frozenset[int] | None = None
    #: Identical lines of several ranks shown once (``merging`` starts it: it needs the count).
    merge: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    colour_out: bool = field(default_factory=lambda: use_colour(sys.stdout))
    colour_err: bool = field(default_factory=lambda: use_colour(sys.stderr))
    #: Streams (True: stderr) that raised on write: gone, never written again.
    closed: set[bool] = field(default_factory=set)
    _merger: LineMerger | None = field(default=None, init=False, repr=False)

    def merging(self, ranks: list[int]) -> None:
        """Merge from now on the lines of these ranks (this node's), if asked to and they are
        several: with one rank there is nothing to merge, and no line is held."""
        shown_ranks = [rank for rank in ranks if self.shows(rank)]
        if self.merge and self.prefix and len(shown_ranks) > 1 and self._merger is None:
            self._merger = LineMerger(self._render, self.raw, expected=len(shown_ranks))

    def shows(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def label(self, host: str, rank: int, stderr: bool) -> bytes:
        if not self.prefix:
            return b""
        text = f"[{host} rank {rank}] ".encode()
        if self.colour_err if stderr else self.colour_out:
            return _COLOURS[rank % len(_COLOURS)] + text + _RESET
        return text

    def worker(self, host: str, rank: int, label: bytes, block: bytes, stderr: bool) -> None:
        """Whole lines of a worker as shown (masked, escaped), each ending in a newline:
        through the merger when there is one, else at once with ``label``."""
        merger = self._merger
        if merger is None:
            self.write(label, block, stderr)
            return
        for line in block[:-1].split(b"\n"):
            merger.add(stderr, host, (rank,), line)

    def _render(self, stderr: bool, text: bytes, sources: Sequence[Source]) -> bytes:
        if len(sources) == 1 and len(sources[0][1]) == 1:
            label = self.label(sources[0][0], sources[0][1][0], stderr)
        else:
            label = f"[{ranks_label(sources)}] ".encode()
            if self.colour_err if stderr else self.colour_out:
                label = _COLOURS[min(min(r) for _, r in sources) % len(_COLOURS)] + label + _RESET
        return label + text + b"\n"

    def flush(self) -> None:
        """Worker lines still held for merging go out (before a line of the launcher's own)."""
        if self._merger is not None:
            self._merger.flush()

    def write(self, label: bytes, line: bytes, stderr: bool) -> None:
        """A worker's line as shown (or several, each ending in a newline) with ``label``
        before each; ``WorkerOutput`` masks and escapes it first."""
        if not line.endswith(b"\n"):
            line += b"\n"
        if label:
            line = b"".join(label + part + b"\n" for part in line[:-1].split(b"\n"))
        self.raw(line, stderr)

    def say(self, text: str, stderr: bool = True) -> None:
        """The launcher's own message (report, warning, note): one or more whole lines, masked."""
        self.flush()
        self.raw(scrub(text).encode("utf-8", "replace") + b"\n", stderr)

    def machine(self, line: str) -> None:
        """A protocol line for the SSH head on stdout (result, stacks): read, never shown, so
        written as is (masking could break its JSON); what it carries from workers, the
        report's last lines, is masked where it is read (``WorkerOutput``, ``read_error_file``)."""
        self.flush()
        self.raw(line.encode("utf-8", "replace") + b"\n", False)

    def raw(self, data: bytes, stderr: bool) -> None:
        with self.lock:
            if stderr in self.closed:
                return
            text = sys.stderr if stderr else sys.stdout
            try:
                text.flush()  # anything print() left in the text layer goes first
                text.buffer.write(data)
                text.buffer.flush()
            except (OSError, ValueError, AttributeError):
                self.closed.add(stderr)  # the console went away; the log files still have it

    def settle(self) -> None:
        """Before the launcher exits: a console that went away must not turn Python's
        exit-time flush into an error (exit 120) nor a BrokenPipeError (exit 141)."""
        self.flush()
        with self.lock:
            for stderr, stream in ((False, sys.stdout), (True, sys.stderr)):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    self.closed.add(stderr)
                if stderr in self.closed:
                    _to_devnull(stream)


def say(text: str) -> None:
    """A launcher message on stderr before supervision starts (notes): a console that went
    away is not an error, and never keeps the job from starting."""
    ConsoleSink(prefix=False).say(text)


def _to_devnull(stream: TextIO) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
        stream.flush()  # what the text layer still holds goes to /dev/null now
    except (OSError, ValueError):
        pass


@dataclass
class _Stream:
    """One pipe's reading state: the incomplete last line, bounded by LINE_LIMIT."""

    is_err: bool
    label: bytes
    pending: bytearray = field(default_factory=bytearray)
    #: In the middle of a line longer than LINE_LIMIT: its rest goes to the file only.
    overlong: bool = False


class WorkerOutput:
    """Pumps one worker's stdout and stderr into its log file and the console."""

    def __init__(self, rank: int, host: str, log_path: str, console: ConsoleSink) -> None:
        self.rank = rank
        self.log_path = log_path
        self.console = console
        self.stderr_tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.last_line_at = 0.0
        #: Why the log file stopped being written (None while it works).
        self.log_error: str | None = None
        self._log_lock = threading.Lock()
        self._log_fd: int | None = None
        self._threads: list[threading.Thread] = []
        self._host = host
        try:
            self._log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            self._log_failed(exc)

    def pump(self, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        """Start one daemon thread per pipe."""
        for pipe, is_err in ((stdout, False), (stderr, True)):
            if pipe is None:
                continue
            stream = _Stream(is_err, self.console.label(self._host, self.rank, is_err))
            thread = threading.Thread(target=self._pump, args=(pipe, stream),
                                      name=f"rank{self.rank}-{'err' if is_err else 'out'}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pump(self, pipe: IO[bytes], stream: _Stream) -> None:
        fd = pipe.fileno()
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            self.last_line_at = time.monotonic()
            self._take(stream, data)
        if stream.pending:
            self._unterminated(stream, bytes(stream.pending))
        elif stream.overlong:
            self._write_log(b"\n")
        pipe.close()

    def _take(self, stream: _Stream, data: bytes) -> None:
        """Whole lines go out at once; an incomplete last line waits in ``pending``."""
        end = data.rfind(b"\n") + 1
        if end == 0:
            self._partial(stream, data)
            return
        block, rest = data[:end], data[end:]
        if stream.overlong:  # the first newline ends the long line, already cut on the console
            first = block.index(b"\n") + 1
            self._write_log(block[:first])
            stream.overlong = False
            block = block[first:]
        if stream.pending:
            block = bytes(stream.pending) + block
            stream.pending.clear()
        if block:
            self._lines(stream, block)
        if rest:
            self._partial(stream, rest)

    def _partial(self, stream: _Stream, data: bytes) -> None:
        if stream.overlong:
            self._write_log(data)
            return
        stream.pending += data
        if len(stream.pending) > LINE_LIMIT:
            head = bytes(stream.pending)
            stream.pending.clear()
            stream.overlong = True
            self._write_log(head)
            self._show(stream, mask(head[:LINE_LIMIT], cut=True) + (_CUT_MARK_NO_LOG if self.log_error else _CUT_MARK)
                       + b"\n")
            if stream.is_err:
                self.stderr_tail.append(self._tail_line(head, more=True) + " [...]")

    def _lines(self, stream: _Stream, block: bytes) -> None:
        """``block``: whole lines, each ending in a newline."""
        self._write_log(block)
        if stream.is_err:
            lines = block.split(b"\n")
            lines.pop()
            self.stderr_tail.extend(self._tail_line(line) for line in lines[-TAIL_LINES:])
        if len(block) > LINE_LIMIT:
            mark = _CUT_MARK_NO_LOG if self.log_error else _CUT_MARK
            block = b"".join(mask(line[:LINE_LIMIT], cut=True) + mark + b"\n" if len(line) > LINE_LIMIT
                             else line + b"\n" for line in block[:-1].split(b"\n"))
        self._show(stream, block)

    def _unterminated(self, stream: _Stream, line: bytes) -> None:
        """The last line, without its newline: the worker may have died inside it (killed at
        teardown halfway through a print), so it is shown as a cut line."""
        self._write_log(line + b"\n")
        if stream.is_err:
            self.stderr_tail.append(self._tail_line(line, more=True))
        self._show(stream, mask(line, cut=True) + b"\n")

    @staticmethod
    def _tail_line(line: bytes, more: bool = False) -> str:
        """A stderr line as the report shows it: masked, at most TAIL_LINE_CHARS characters.
        ``more``: the line goes on past ``line``; a secret split by either cut is masked too."""
        piece = line[:TAIL_LINE_CHARS * 4]
        text = mask(piece, cut=more or len(piece) < len(line)).decode(errors="replace")
        return scrub(text[:TAIL_LINE_CHARS], cut=True) if len(text) > TAIL_LINE_CHARS else text

    def _show(self, stream: _Stream, block: bytes) -> None:
        # A rank whose log file failed is shown even when logs.ranks hides it: the console
        # is all that is left of its output.
        if self.console.shows(self.rank) or self.log_error is not None:
            # Masked before escaped: a secret holding a control character matches raw.
            self.console.worker(self._host, self.rank, stream.label, visible(mask(block)), stream.is_err)

    def _write_log(self, data: bytes) -> None:
        failure = None
        with self._log_lock:
            if self._log_fd is None:
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._log_fd, view):]
            except OSError as exc:
                failure = exc
                self.log_error = exc.strerror or type(exc).__name__  # before any other line is shown
                self._close_log()
        if failure is not None:
            self._log_failed(failure)

    def _log_failed(self, exc: OSError) -> None:
        """One warning, then console only: a full or broken log disk never harms the job."""
        self.log_error = exc.strerror or type(exc).__name__
        self.console.say(f"clusterddp: warning: rank {self.rank}: cannot write its log {shown(self.log_path)} "
                         f"({self.log_error}); its output goes to the console only from now on")

    def _close_log(self) -> None:
        fd, self._log_fd = self._log_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self, deadline: float | None = None) -> None:
        """Wait (until ``deadline``, monotonic) for the pipes to drain, then close the log file.

        A pipe still held open by a process that escaped every kill keeps its reader thread
        (a daemon) blocked; whatever it reads later is dropped, not written to a closed file.
        """
        if deadline is None:
            deadline = time.monotonic() + 2.0
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._log_lock:
            self._close_log()
