"""What the supervisor is asked from outside its loop: stop, end an attempt, dump stacks.

Signal handlers and the stdin-watch thread only write a field here and wake the loop; the
loop alone reads the fields and acts on them. A handler that did more (tear down, print)
would run between two bytecodes of the loop, in the middle of whatever it was doing.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from clusterddp.launch.supervise.waker import Waker
from clusterddp.protocol import STACKS_REQUEST_SIGNAL, STOP_SIGNALS


class Requests:
    """The loop's inbox; every method is safe from a signal handler or another thread."""

    def __init__(self) -> None:
        self.wake = Waker()  # see waker.py for why not a threading.Event
        #: Why the launcher stops (the first request wins), and the signal that asked, if any.
        self.stop_reason: str | None = None
        self.stop_signal: int | None = None
        #: The attempt whose end was asked for, and why; kept until another is asked for, so
        #: a word that came early still ends its attempt and a late one none.
        self.end_requested: tuple[int, str] | None = None
        self._stacks = False

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None

    def stop(self, reason: str, signum: int | None = None) -> None:
        """Tear everything down and end the launcher."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stop_signal = signum
        self.wake.set()

    def end_attempt(self, attempt: int, reason: str) -> None:
        """End attempt ``attempt`` as a failure of another node's: its workers are torn down,
        the launcher stays, and the coordinator decides what comes next."""
        self.end_requested = (attempt, reason)
        self.wake.set()

    def stacks(self) -> None:
        self._stacks = True
        self.wake.set()

    def take_stacks(self) -> bool:
        """Was a stacks dump asked for since the last call?"""
        asked, self._stacks = self._stacks, False
        return asked

    def nap(self, seconds: float) -> None:
        """Sleep until woken or ``seconds`` passed (the loop's tick)."""
        self.wake.wait(seconds)
        self.wake.clear()


@contextmanager
def signals_handled(requests: Requests, forward_signals: tuple[int, ...],
                    forward: Callable[[int], None]) -> Iterator[None]:
    """The launcher's signals turned into requests while the block runs: the stop signals
    (``protocol.STOP_SIGNALS``) ask for a stop, the stacks signal for a dump, SIGCHLD wakes the
    loop, and ``forward_signals`` go to the workers. Outside the main thread (a test's
    supervisor) Python takes no handlers: then nothing is installed."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        def on_stop(signum: int, _frame: object) -> None:
            requests.stop(f"the launcher received {signal.Signals(signum).name}", signum)

        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, on_stop)
        for forwarded in forward_signals:
            previous[forwarded] = signal.signal(forwarded, lambda signum, _frame: forward(signum))
        previous[STACKS_REQUEST_SIGNAL] = signal.signal(STACKS_REQUEST_SIGNAL, lambda *_: requests.stacks())
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: requests.wake.set())
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
