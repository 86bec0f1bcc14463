"""Preemption: turn a scheduler's warning signal into checkpoint-and-exit at a step boundary.

SLURM (``--signal=USR1@120``), Kubernetes and the clusterddp launcher warn a job before
killing it. The handler here only sets a flag: writing a checkpoint from inside a signal
handler could run in the middle of an optimizer step or a collective. The training loop
agrees on the flag across ranks at the next step boundary (a signal may reach only some
ranks, or reach them at different steps), writes a checkpoint, and every rank exits with
``PREEMPTED_EXIT_CODE`` (75, EX_TEMPFAIL), which a requeue wrapper can test for.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Iterable

from clusterddp.train.exitcodes import PREEMPTED_EXIT_CODE

__all__ = ["PREEMPTED_EXIT_CODE", "Preempted", "PreemptionHandler", "parse_signals"]

#: Signals the cluster managers use as a warning. SIGINT is left alone on purpose: Ctrl-C
#: should stop an interactive run now, not after a checkpoint.
DEFAULT_SIGNALS = ("SIGUSR1", "SIGTERM")


class Preempted(SystemExit):
    """Raised on every rank after the preemption checkpoint is written.

    A ``SystemExit``: uncaught, the process exits with ``PREEMPTED_EXIT_CODE`` without a
    traceback, and ``finally`` blocks (``cleanup()``) still run.
    """

    def __init__(self, checkpoint: str | None, signal_name: str | None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.checkpoint = checkpoint
        self.signal_name = signal_name


def parse_signals(names: Iterable[str | int | signal.Signals]) -> list[signal.Signals]:
    """``["SIGUSR1", "TERM", 10]`` -> signal enums; unknown names raise with the valid ones."""
    out = []
    for name in names:
        if isinstance(name, signal.Signals):
            out.append(name)
        elif isinstance(name, int) or str(name).isdigit():
            out.append(signal.Signals(int(name)))
        else:
            text = str(name).upper()
            text = text if text.startswith("SIG") else "SIG" + text
            try:
                out.append(signal.Signals[text])
            except KeyError:
                raise ValueError(f"unknown signal {name!r}; use e.g. SIGUSR1, SIGUSR2, SIGTERM") from None
    return out


class PreemptionHandler:
    """Installs handlers that record a preemption request; ``requested`` reads it.

    Use as a context manager (``with PreemptionHandler(): ...``) to restore the previous
    handlers afterwards. A repeated signal changes nothing: SLURM may signal both the
    launcher and the worker, and a second signal must not kill the checkpoint being written.
    Signal handlers can only be installed from the main thread.

    The handler takes no lock: it only sets attributes. Under SLURM every worker gets the
    signal twice, microseconds apart (slurmstepd signals every process of the step, and the
    launcher forwards it too), and Python runs the second handler inside the first one. With a
    ``threading.Event`` here the nested ``set()`` waited for the lock the interrupted outer
    ``set()`` held: that rank hung, every other rank waited for it in the next all-reduce, and
    the job never exited 75 (about one SLURM preemption in three; reproduced in
    tests/train/test_train_pieces.py).
    """

    def __init__(self, signals: Iterable[str | int | signal.Signals] = DEFAULT_SIGNALS) -> None:
        self.signals = parse_signals(signals)
        self.signal_name: str | None = None
        self._requested = False
        self._previous: dict[signal.Signals, object] = {}

    @property
    def requested(self) -> bool:
        """True once any of the signals arrived (or ``request()`` was called)."""
        return self._requested

    def request(self, signal_name: str = "manual") -> None:
        """Ask for a preemption stop as if a signal had arrived (tests, custom triggers)."""
        if self.signal_name is None:
            self.signal_name = signal_name
        self._requested = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.request(signal.Signals(signum).name)

    def install(self) -> "PreemptionHandler":
        """Start catching the signals."""
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were there before ``install()``."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def __enter__(self) -> "PreemptionHandler":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
