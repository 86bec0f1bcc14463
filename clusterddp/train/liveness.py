"""The rank's progress file: steps, their time, the rank's own compute, and its phase.

The launcher sets ``protocol.HEARTBEAT_FILE_ENV`` to a per-worker path. Its mtime is the
liveness signal the hang detector reads (``clusterddp.hang``); its content is this rank's
progress file, one small JSON object (``clusterddp.progress`` reads it)::

    {"v": 1, "step": 120, "t": 1767000000.5, "steps": 7, "step_s": 0.141, "compute_s": 0.093,
     "phase": "train", "phase_t": 1767000000.1}

``step``: the last completed step; ``t``: the wall time it ended; ``steps``: steps since the
previous record; ``step_s``: their mean wall time (end to end, data loading included);
``compute_s``: the mean of the rank's own work outside collectives over them, when the caller
knows it (the quantity that differs between a slow rank and one waiting for it); ``phase``:
what the rank does ("train", or one a helper announced: "checkpoint", "eval", "data", any
name), since the wall time ``phase_t``; ``last`` (once one ended): the previous phase as
``[name, start, end]``, so a checkpoint shorter than the launcher's read interval is seen.

Cheap by construction: a step costs one ``time.monotonic()`` and a few additions; the file is
rewritten in place (open, one ``pwrite`` at offset 0, close) at most once per ``MIN_INTERVAL``
seconds, and at once when the phase changes, so the launcher sees a checkpoint begin. The
record is padded with spaces to the previous record's length instead of truncating, so a
reader never sees a shorter file with the old record's tail (JSON ignores trailing spaces).
Any error (a vanished directory) is swallowed: a missing record must never kill a run.
No torch here: any script may use it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, Iterator

from clusterddp.protocol import HEARTBEAT_FILE_ENV

#: At most one write of the record per this many seconds (phase changes are written at once).
MIN_INTERVAL = 1.0
#: The record's format version (``clusterddp.progress`` reads versions it knows).
VERSION = 1
#: The phase of a rank that completes steps and announced nothing else.
TRAIN = "train"
#: The phase announced once the script has returned (``ended``; ``clusterddp.hang.EXIT``).
EXIT = "exit"


class _Record:
    """This process's progress since its last write; one per process (module state)."""

    def __init__(self) -> None:
        self.last_write = float("-inf")   # monotonic time of the last write
        self.size = 0                     # bytes of the last record written (padding target)
        self.step: int | None = None      # last completed step
        self.end_mono: float | None = None  # monotonic time that step ended
        self.steps = 0                    # steps since the last write
        self.timed = 0                    # of them, those with a known wall time
        self.wall = 0.0                   # sum of their wall times
        self.compute_n = 0
        self.compute = 0.0
        self.phase = TRAIN
        self.phase_t = time.time()
        #: The last phase that ended: [name, start, end] (wall), so a phase shorter than
        #: the launcher's read interval is still seen.
        self.last: list[object] | None = None
        self.path: str | None = None
        self.path_known = False


_state = _Record()


def heartbeat(step: int | None = None, compute_s: float | None = None) -> bool:
    """One step ended: count it, and rewrite the record if the last write is ``MIN_INTERVAL`` old
    (or this is the first step: the launcher learns at once that training began).

    ``step``: its number (default: one more than the last); ``compute_s``: the rank's own work
    in it outside collectives, in seconds, when the caller measured it. Each call is one step
    (``clusterddp.train``'s loop calls it once per step). Returns True when the file was
    written (its mtime is the hang detector's sign of life).
    """
    state = _state
    now = time.monotonic()
    if state.end_mono is not None:
        state.wall += now - state.end_mono
        state.timed += 1
    state.end_mono = now
    first = state.step is None
    state.step = (state.step + 1 if state.step is not None else 1) if step is None else step
    state.steps += 1
    if compute_s is not None:
        state.compute += compute_s
        state.compute_n += 1
    if now - state.last_write < MIN_INTERVAL and not first:
        return False
    return _write(state, now)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """``with phase("checkpoint"):``: announce what the rank does besides stepping (written at
    once, and again when it ends), so the launcher does not take a long checkpoint for a hang
    and the report counts its time. Phases nest; the enclosing one resumes after."""
    state = _state
    previous = state.phase
    if previous == name:  # already in it (a helper inside the user's own announcement)
        yield
        return
    _announce(state, name)
    began = state.phase_t
    try:
        yield
    finally:
        state = _state
        state.last = [name[:64], round(began, 3), round(time.time(), 3)]
        _announce(state, previous)


class StepTimer:
    """What ``with step() as s:`` hands the block: ``s.compute()`` marks the rank's own work."""

    def __init__(self) -> None:
        self.compute_s: float | None = None

    @contextmanager
    def compute(self) -> Iterator[None]:
        """``with s.compute():`` around work outside collectives (forward, loss, optimizer
        step; not backward under DDP, which waits for the gradient all-reduce); may be used
        several times in one step, the times add up."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.compute_s = (self.compute_s or 0.0) + time.perf_counter() - began


@contextmanager
def step(number: int | None = None) -> Iterator[StepTimer]:
    """``with step() as s:`` around one training step, for scripts not using ``fit``: one
    ``heartbeat`` when the block ends without an exception, with the compute time the block
    marked with ``s.compute()`` (unknown when it marked none)."""
    timer = StepTimer()
    yield timer
    heartbeat(number, timer.compute_s)


class PhaseMarks:
    """Phases opened and closed by separate calls, for frameworks that announce a phase's start
    and end in two hooks (Lightning's ``on_validation_start``/``_end``, HF's ``on_save``)
    instead of around one block: ``enter("eval")`` ... ``leave("eval")``. Entering a phase
    already open does nothing; leaving one closes the phases opened inside it first (a hook
    that never came, an exception); ``leave_all`` closes everything (training ended)."""

    def __init__(self) -> None:
        self._open: list[tuple[str, AbstractContextManager[None]]] = []

    def enter(self, name: str) -> None:
        if self.is_open(name):
            return
        mark = phase(name)
        mark.__enter__()
        self._open.append((name, mark))

    def leave(self, name: str) -> None:
        if not self.is_open(name):
            return
        while self._open:
            opened, mark = self._open.pop()
            mark.__exit__(None, None, None)
            if opened == name:
                return

    def leave_all(self) -> None:
        while self._open:
            self.leave(self._open[-1][0])

    def is_open(self, name: str) -> bool:
        return any(opened == name for opened, _ in self._open)


def ended() -> None:
    """The script has returned: announce ``EXIT`` until the process ends. The worker's bootstrap
    calls it before the atexit handlers and flushes, which take seconds on a loaded machine
    (gloo's teardown): ``hang_timeout: auto`` must not count a finished rank's exit as a stall.
    Nothing is written for a script that never wrote a record."""
    state = _state
    if state.size and state.phase != EXIT:
        _announce(state, EXIT)


def _announce(state: _Record, name: str) -> None:
    state.phase = name
    state.phase_t = time.time()
    _write(state, time.monotonic())


def _write(state: _Record, now: float) -> bool:
    if not state.path_known:
        state.path = os.environ.get(HEARTBEAT_FILE_ENV) or None
        state.path_known = True
    if state.path is None:
        return False
    state.last_write = now
    wall = time.time()
    record: dict[str, object] = {
        "v": VERSION, "step": state.step,
        "t": round(wall - (now - state.end_mono), 3) if state.end_mono is not None else None,
        "steps": state.steps,
        "step_s": round(state.wall / state.timed, 6) if state.timed else None,
        "compute_s": round(state.compute / state.compute_n, 6) if state.compute_n else None,
        "phase": state.phase[:64], "phase_t": round(state.phase_t, 3),
    }
    if state.last is not None:
        record["last"] = state.last
    data = json.dumps(record, separators=(",", ":")).encode()
    padded = data.ljust(state.size)
    state.steps = state.timed = state.compute_n = 0
    state.wall = state.compute = 0.0
    try:
        fd = os.open(state.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.pwrite(fd, padded, 0)
        finally:
            os.close(fd)
    except OSError:
        return False
    state.size = len(padded)
    return True


def reset() -> None:
    """Forget everything recorded, and the file: a new run in the same process (tests)."""
    global _state
    _state = _Record()


def lazy_callback(module: str, hooks: type, base: Callable[[], type]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that makes ``ProgressCallback`` (``hooks`` mixed into the
    framework's callback base) on first use: importing the module, or ``clusterddp.train``,
    never imports Lightning or transformers, whose import costs seconds and may be absent."""

    def __getattr__(name: str) -> Any:
        if name != "ProgressCallback":
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        made = type("ProgressCallback", (hooks, base()), {
            "__module__": module,
            "__doc__": "Per-rank progress and phases for clusterddp's launcher (see the module docstring)."})
        setattr(sys.modules[module], name, made)
        return made

    return __getattr__
