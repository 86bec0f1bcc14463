"""The SSH session to the head, seen from a remote launcher (``--watch-stdin``).

The head keeps the session's stdin open and writes a heartbeat to it; it sends
``protocol.STACKS_REQUEST_BYTE`` to ask for stacks. stdin EOF or a silent heartbeat means
the head or the link is gone: the launcher must stop its workers. A stop byte just before EOF
(``protocol.stop_request_byte``) names the signal the head got, so this host stops as if it
had got it itself (Ctrl-C reaches the workers as SIGINT, exit 130).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

from clusterddp.protocol import STACKS_REQUEST_BYTE, stop_requested


class StdinWatch:
    """Reads stdin on a daemon thread; ``check`` on the supervisor's tick spots a silent head."""

    def __init__(self, heartbeat_timeout: float, stop: Callable[[str, int | None], None],
                 stacks: Callable[[], None]) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self._stop = stop
        self._stacks = stacks
        self._last_heartbeat = time.monotonic()

    def start(self) -> None:
        self._last_heartbeat = time.monotonic()
        threading.Thread(target=self._read, name="stdin-watch", daemon=True).start()

    def _read(self) -> None:
        # os.read on the raw fd, not sys.stdin.buffer: a daemon thread blocked inside the
        # buffered reader holds its lock at interpreter exit, and Python aborts (exit 134).
        while True:
            try:
                chunk = os.read(0, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                self._stop("the SSH session to the head closed (stdin EOF)", None)
                return
            self._last_heartbeat = time.monotonic()
            signum = stop_requested(chunk)
            if signum is not None:
                self._stop(f"the head received {signal.Signals(signum).name}", signum)
            if STACKS_REQUEST_BYTE in chunk:
                self._stacks()

    def check(self) -> None:
        """Ask to stop when the head has been silent longer than the heartbeat timeout."""
        silent = time.monotonic() - self._last_heartbeat
        if silent > self.heartbeat_timeout:
            self._stop(f"no heartbeat from the head for {silent:.0f}s (link lost?)", None)
