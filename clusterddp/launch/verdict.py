"""Will this failure repeat? The restart verdict, from what is already known: pure, plain data in.

An attempt failed. What the launcher knows: the first failed worker's exit (code or signal)
and the last lines it wrote (the traceback ``@record`` kept in the error file, else its
stderr tail), whether any rank completed a step in the attempt (the progress record:
``RunLog.progressed``), and the failure of the attempt before. A failure that will repeat
identically is not retried (pytorch#60910): restarting it only spends ``restarts`` and
backoff on the same traceback.

Judged deterministic, when no step completed in the attempt:

- an exception of ``DETERMINISTIC`` (the code or its environment is wrong: SyntaxError,
  ImportError/ModuleNotFoundError, NameError, a missing file, an ``assert``);
- exit 2 with no exception: argparse rejected the arguments;
- the same exception at the same place (file:line) as the attempt before.

Never deterministic: a worker killed by a signal (SIGKILL, the OOM killer, SIGTERM from
outside), a hang, any failure after a step completed (a collective timeout, a lost peer).
``restart_on:`` in the job file widens or narrows this (``spec.RestartOnSpec``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

from clusterddp.spec import RestartOnSpec

#: Exceptions that, before any progress, will be raised again by the same code and files.
DETERMINISTIC = frozenset({
    "SyntaxError", "IndentationError", "TabError", "ImportError", "ModuleNotFoundError",
    "NameError", "UnboundLocalError", "FileNotFoundError", "NotADirectoryError", "IsADirectoryError",
    "AssertionError",
})
#: argparse's exit code for bad arguments (``parser.error``).
USAGE_EXIT = 2

_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))(?::.*)?$")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
#: What torch puts before every line of an uncaught exception's traceback once a process
#: group exists (``[rank0]: Traceback ...``): without it off, an assert at step 0 of any DDP
#: script would read as a bare exit 1, and be restarted.
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")


@dataclass(frozen=True)
class Failure:
    """What one attempt's root cause says about itself."""

    exit_code: int
    #: The signal that killed the worker (``SIGKILL``); None when it exited.
    signal: str | None = None
    #: The exception's class name (``ImportError``), from its traceback; None: none seen.
    exception: str | None = None
    #: ``train.py:3``: the innermost frame of the traceback; None: not known.
    where: str | None = None
    #: The exception's line (or the last line, for an exit without one), shortened.
    message: str | None = None
    #: A hang ended the attempt (exit 124 from the launcher itself).
    hang: bool = False

    def same_as(self, other: Failure | None) -> bool:
        """The same exception at the same place (an exit without a traceback is never judged
        the same: nothing says it failed at the same place)."""
        if other is None or self.exception is None:
            return False
        return (self.exception, self.where, self.exit_code) == (other.exception, other.where, other.exit_code)

    def name(self) -> str:
        """``ImportError at train.py:3``, ``exit 2``, ``SIGKILL``."""
        if self.hang:
            return "hang"
        if self.signal:
            return self.signal
        what = self.exception or f"exit {self.exit_code}"
        return f"{what} at {self.where}" if self.where else what


def failure_of(exit_code: int, signal: str | None, tail: Sequence[str], hang: bool = False) -> Failure:
    """The failure a worker's end and last lines show (a Python traceback is read for the
    exception's class and innermost frame; anything else leaves them unknown)."""
    if hang or signal:
        return Failure(exit_code, signal=signal, hang=hang)
    lines = [_RANK_PREFIX.sub("", line.rstrip(), count=1) for line in tail if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        found = _EXCEPTION.match(lines[i])
        if found is None:
            continue
        where = None
        for earlier in reversed(lines[:i]):
            frame = _FRAME.match(earlier)
            if frame:
                where = f"{os.path.basename(frame.group(1))}:{frame.group(2)}"
                break
        return Failure(exit_code, exception=found.group(1), where=where, message=lines[i][:200])
    return Failure(exit_code, message=lines[-1][:200] if lines else None)


def will_repeat(failure: Failure, progressed: bool, previous: Failure | None, previous_attempt: int | None,
                rule: RestartOnSpec) -> str | None:
    """Why ``failure`` will repeat (the rest of ``not restarting: ...``), or None: restart it.

    ``progressed``: a step completed in this attempt; ``previous``: the failure of the attempt
    before (number ``previous_attempt``), None for the first.
    """
    name = failure.exception
    if name is not None and name in rule.never:
        return f"{failure.name()}: restart_on.never lists {name}"
    if failure.signal or failure.hang or progressed or rule.deterministic:
        return None
    if name is not None and name in rule.always:
        return None
    if failure.same_as(previous):
        return f"the same {failure.name()} before any progress, as in attempt {previous_attempt}"
    if name in DETERMINISTIC:
        return f"{failure.name()} before any progress: it will fail the same way again"
    if name is None and failure.exit_code == USAGE_EXIT:
        said = f" ({failure.message})" if failure.message else ""
        return f"exit {USAGE_EXIT} before any progress, a usage error{said}: it will fail the same way again"
    return None
