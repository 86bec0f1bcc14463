"""Worker output: every line to the rank's log file and, optionally, to the console with a prefix.

One reader thread per pipe, reading whole lines with ``readline`` on the binary pipe, so no
line is split or interleaved with another rank's, and a fast printer only ever waits on
the pipe buffer (64 KiB), not on the console.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import IO, Deque, TextIO

#: Lines of stderr kept per worker for the root-cause report.
TAIL_LINES = 20

_COLOURS = (b"\033[36m", b"\033[32m", b"\033[33m", b"\033[35m", b"\033[34m", b"\033[31m")
_RESET = b"\033[0m"


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
    """The launcher's stdout/stderr, shared by all reader threads under one lock."""

    prefix: bool = True
    ranks: frozenset[int] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    colour_out: bool = field(default_factory=lambda: use_colour(sys.stdout))
    colour_err: bool = field(default_factory=lambda: use_colour(sys.stderr))

    def shows(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def label(self, host: str, rank: int, stderr: bool) -> bytes:
        if not self.prefix:
            return b""
        text = f"[{host} rank {rank}] ".encode()
        if self.colour_err if stderr else self.colour_out:
            return _COLOURS[rank % len(_COLOURS)] + text + _RESET
        return text

    def write(self, label: bytes, line: bytes, stderr: bool) -> None:
        stream = sys.stderr.buffer if stderr else sys.stdout.buffer
        if not line.endswith(b"\n"):
            line += b"\n"
        with self.lock:
            try:
                stream.write(label + line)
                stream.flush()
            except (BrokenPipeError, ValueError):
                pass  # the console went away (head's pipe closed); the log file still has it


class WorkerOutput:
    """Pumps one worker's stdout and stderr into its log file and the console."""

    def __init__(self, rank: int, host: str, log_path: str, console: ConsoleSink) -> None:
        self.rank = rank
        self.log_path = log_path
        self.console = console
        self.stderr_tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.last_line_at = 0.0
        self._log = open(log_path, "ab", buffering=0)
        self._log_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._labels = {False: console.label(host, rank, False), True: console.label(host, rank, True)}

    def pump(self, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        """Start one daemon thread per pipe."""
        for pipe, is_err in ((stdout, False), (stderr, True)):
            if pipe is None:
                continue
            thread = threading.Thread(target=self._pump, args=(pipe, is_err),
                                      name=f"rank{self.rank}-{'err' if is_err else 'out'}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pump(self, pipe: IO[bytes], is_err: bool) -> None:
        import time

        show = self.console.shows(self.rank)
        label = self._labels[is_err]
        with pipe:
            for line in iter(pipe.readline, b""):
                self.last_line_at = time.monotonic()
                with self._log_lock:
                    self._log.write(line if line.endswith(b"\n") else line + b"\n")
                if is_err:
                    self.stderr_tail.append(line.decode(errors="replace").rstrip("\n"))
                if show:
                    self.console.write(label, line, is_err)

    def close(self, timeout: float = 2.0) -> None:
        """Wait for the pipes to drain (the worker is gone), then close the log file."""
        for thread in self._threads:
            thread.join(timeout)
        self._log.close()
