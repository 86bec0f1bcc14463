"""The SSH session to the head, seen from a remote launcher (``--watch-stdin``).

The head keeps the session's stdin open and writes a keepalive to it; it sends
``protocol.STACKS_REQUEST_BYTE`` to ask for stacks. stdin EOF or a silent keepalive means
the head or the link is gone: the launcher must stop its workers. A stop byte just before EOF
(``protocol.stop_request_byte``) names the signal the head got, so this host stops as if it
had got it itself (Ctrl-C reaches the workers as SIGINT, exit 130).

With ``--await-restart`` the head also says when an attempt ends and whether the next one
runs here in place (``protocol.end_attempt_word``, ``protocol.restart_word``): ``StdinWatch``
is then this node's ``Coordinator`` (coordinate.py). After a failed attempt the launcher waits
in ``next_attempt`` for the head's word, the zygote kept; EOF, a stop byte or a silent
keepalive while it waits end the launcher as they would during an attempt.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from typing import Callable

from clusterddp.launch.restart.coordinate import AttemptEnded, Restart
from clusterddp.protocol import StdinWords


class StdinWatch:
    """Reads stdin on a daemon thread; ``check`` on the supervisor's tick spots a silent head."""

    def __init__(self, keepalive_timeout: float, stop: Callable[[str, int | None], None],
                 stacks: Callable[[], None], end_attempt: Callable[[int, str], None] | None = None) -> None:
        self.keepalive_timeout = keepalive_timeout
        self._stop = stop
        self._stacks = stacks
        self._end_attempt = end_attempt
        self._last_keepalive = time.monotonic()
        #: The head's restart words, in the order they came (read by ``next_attempt``).
        self._restarts: queue.Queue[Restart] = queue.Queue()

    def start(self) -> None:
        self._last_keepalive = time.monotonic()
        threading.Thread(target=self._read, name="stdin-watch", daemon=True).start()

    def _read(self) -> None:
        # os.read on the raw fd, not sys.stdin.buffer: a daemon thread blocked inside the
        # buffered reader holds its lock at interpreter exit, and Python aborts (exit 134).
        words = StdinWords()
        while True:
            try:
                chunk = os.read(0, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                self._stop("the SSH session to the head closed (stdin EOF)", None)
                return
            self._last_keepalive = time.monotonic()
            for kind, number, word in words.feed(chunk):
                if kind == "stop":
                    self._stop(f"the head received {signal.Signals(number).name}", number)
                elif kind == "stacks":
                    self._stacks()
                elif kind == "end" and self._end_attempt is not None:
                    self._end_attempt(number, "the head ended the attempt (a failure elsewhere)")
                elif kind == "restart" and word is not None:
                    self._restarts.put(Restart(**word._asdict()))

    def check(self) -> None:
        """Ask to stop when the head has been silent longer than the keepalive timeout."""
        silent = time.monotonic() - self._last_keepalive
        if silent > self.keepalive_timeout:
            self._stop(f"no keepalive from the head for {silent:.0f}s (link lost?)", None)

    def next_attempt(self, ended: AttemptEnded, stopping: Callable[[], bool]) -> Restart | None:
        """The ``Coordinator`` of a launcher the head started with ``--await-restart``: the
        supervisor has reported ``ended`` (its result line); wait for the head's restart word
        for the next attempt. A word for another attempt (late, of an earlier round) is
        dropped. The keepalive is checked as during an attempt, so a silent head ends it."""
        while not stopping():
            self.check()
            try:
                told = self._restarts.get(timeout=0.05)
            except queue.Empty:
                continue
            if told.attempt == ended.attempt + 1:
                return told
        return None
