"""A stop signal before the supervisor listens still ends the command with 128 + signal.

The supervisor (and the SSH head) turn SIGTERM, SIGHUP and SIGQUIT into an orderly teardown
and exit 143/129/131, but only once they have installed their handlers, a second or so into
``clusterddp run`` (parsing the job, planning, starting the warm interpreter). A scheduler's
SIGTERM in that window used to kill the launcher by the signal (-15): the batch script, the
pod's status and the SSH head then read "killed", not "stopped", and the cleanup in ``finally``
blocks never ran. From the command's first line these signals raise ``StoppedEarly`` instead,
as SIGINT raises KeyboardInterrupt: what was started is cleaned up on the way out (the same
paths a Ctrl-C takes), and the CLI ends with one line and 128 + the signal.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

#: What the supervisor handles as a stop (clusterddp.protocol.STOP_SIGNALS), but SIGINT:
#: Python's own KeyboardInterrupt already covers it.
EARLY_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class StoppedEarly(BaseException):
    """A stop signal arrived before anything handled it in an orderly way. A BaseException,
    as KeyboardInterrupt: ``except Exception`` in start-up code must not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum: int, _frame: object) -> None:
    raise StoppedEarly(signum)


def install() -> dict[int, Any]:
    """Raise StoppedEarly on each early signal whose disposition is still the default (one the
    caller inherited as ignored, ``nohup``'s SIGHUP, stays ignored). Returns what was there.
    Only the main thread may set handlers; elsewhere nothing is changed."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for sig in EARLY_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, _raise)
    return previous
