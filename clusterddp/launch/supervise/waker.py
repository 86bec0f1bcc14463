"""A wake-up call that signal handlers may make: an event built on a pipe, not on a lock.

Why not ``threading.Event``: a Python signal handler runs in the main thread between two
bytecodes, possibly while that same thread holds the Event's internal lock (at the end of
``wait()``, inside ``clear()``). ``Event.set()`` in the handler then waits for a lock its own
thread holds, and the launcher hangs forever with its workers gone (seen once in about a
thousand supervised runs, after a SIGCHLD). Writing a byte to a non-blocking pipe takes no
lock; ``select`` on the other end is the wait.
"""

from __future__ import annotations

import os
import select


class Waker:
    """``set`` from anywhere (a thread, a signal handler); ``wait`` and ``clear`` from one loop.

    The pipe is never closed: a late ``set`` from the stdin-watch thread must not write into
    whatever file would reuse the descriptor. Two descriptors per launcher, gone at its exit.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # not inherited by workers (O_CLOEXEC)
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        try:
            os.write(self._write, b"!")
        except OSError:
            pass  # full (already set many times over) or closed (the run is over)

    def wait(self, timeout: float) -> bool:
        """True when set (before or during the wait), False after ``timeout`` seconds."""
        try:
            ready, _, _ = select.select([self._read], [], [], max(0.0, timeout))
        except (OSError, ValueError):
            return False
        return bool(ready)

    def clear(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except OSError:
            pass  # BlockingIOError: drained

