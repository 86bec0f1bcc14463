"""Will this failure repeat? The restart verdict, from what is already known: pure, plain data in.

An attempt failed. What the launcher knows: the first failed worker's exit (code or signal)
and the last lines it wrote (the traceback ``@record`` kept in the error file, else its
stderr tail), whether any rank completed a step in the attempt (the progress file:
``RunLog.progressed``), and the failure of the attempt before. A failure that will repeat
identically is not retried (pytorch#60910): restarting it only spends ``restarts`` and
backoff on the same traceback.

Judged deterministic, when no step completed in the attempt:

- an exception of ``DETERMINISTIC`` (the code or its environment is wrong: SyntaxError,
  ImportError/ModuleNotFoundError, NameError, a missing file, an ``assert``);
- exit 2 with no exception: argparse rejected the arguments;
- the same exception at the same place (file:line) as the attempt before.

The first two judge one rank's failure; ``verdict`` then weighs every rank's: when a rank
was healthy (stopped by clusterddp, or still running) or failed otherwise, the failure hit
some ranks only, which is how a race between ranks fails (rank 1 lists a directory rank 0
has not made yet), and it is restarted as a transient fault, with a line saying so. Every
rank that ended by itself with the same failure, or the same failure in the next attempt:
deterministic.

Never deterministic: a worker killed by a signal (SIGKILL, the OOM killer, SIGTERM from
outside), a hang, any failure after a step completed (a collective timeout, a lost peer).
``restart_on:`` in the job file widens or narrows this (``spec.RestartOnSpec``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from clusterddp.exitcodes import PREEMPTED
from clusterddp.launch.observe.exits import WorkerExit
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

    def alike(self, other: Failure) -> bool:
        """Two ranks failed the same way: the same exception at the same place, or (with no
        traceback on either) the same exit code or signal."""
        if self.exception is not None or other.exception is not None:
            return (self.exception, self.where) == (other.exception, other.where)
        return (self.exit_code, self.signal, self.hang) == (other.exit_code, other.signal, other.hang)

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


@dataclass(frozen=True)
class RankEnd:
    """How one rank's attempt ended, as the verdict needs it: the failure it ended with by
    itself, or None when it was healthy (stopped by clusterddp, still running, or finished)."""

    rank: int
    failure: Failure | None = None

    def to_json(self) -> dict[str, object]:
        return {"rank": self.rank, "failure": self.failure.__dict__ if self.failure else None}

    @staticmethod
    def from_json(data: object) -> RankEnd | None:
        """The end ``data`` describes; None when it is not one (a peer's word is checked)."""
        if not isinstance(data, Mapping) or type(data.get("rank")) is not int:
            return None
        failure = data.get("failure")
        try:
            return RankEnd(int(data["rank"]), Failure(**failure) if isinstance(failure, dict) else None)
        except TypeError:
            return None


#: How long the other ranks get to end by themselves after a failure that looks
#: deterministic, before they are stopped (``LocalSupervisor``): ranks that run the same code
#: hit the same bug moments apart, even forked cold on a loaded machine.
VERDICT_WINDOW = 3.0


def rank_ends(exits: Sequence[WorkerExit]) -> list[RankEnd]:
    """Each rank's end: its failure when it ended by itself with a non-zero exit; healthy when
    it finished, saved a checkpoint on a stop (75), or was stopped by clusterddp. A rank
    clusterddp was stopping that exited with a traceback of its own (an exit code, not the
    stop's signal) had failed by itself first: a loaded machine's teardown can overtake it."""
    return [RankEnd(e.rank, _own_failure(e)) for e in exits]


def _own_failure(exit: WorkerExit) -> Failure | None:
    if exit.returncode in (0, PREEMPTED) or (exit.stopped_by_us and exit.returncode < 0):
        return None
    failure = failure_of(exit.exit_code, exit.signal_name, exit.tail)
    if exit.stopped_by_us and failure.exception is None:  # e.g. a SIGTERM handler's sys.exit(143)
        return None
    return failure


def spread(root: Failure, ends: Sequence[RankEnd]) -> str | None:
    """Why ``root`` is one rank's failure and not every rank's: ``on rank 1 only; ranks 0 were
    healthy``; None when every rank that ended failed like the root (or nothing is known).

    A failure that depends on timing between ranks (a race on a directory only rank 0
    creates) hits some ranks while their peers are fine; a failure in the code or its
    environment hits every rank the same way (issue "judge a restart from every rank")."""
    if not ends:
        return None
    alike = sorted(end.rank for end in ends if end.failure is not None and end.failure.alike(root))
    other = sorted(end.rank for end in ends if end.failure is not None and not end.failure.alike(root))
    healthy = sorted(end.rank for end in ends if end.failure is None)
    if not healthy and not other:
        return None
    said = f"on {_ranks(alike)} only" if alike else "on one rank"
    if healthy:
        said += f"; {_ranks(healthy)} {'was' if len(healthy) == 1 else 'were'} healthy"
    if other:
        said += f"; {_ranks(other)} failed otherwise"
    return said


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def verdict(failure: Failure, progressed: bool, previous: Failure | None, previous_attempt: int | None,
            rule: RestartOnSpec, ends: Sequence[RankEnd] = ()) -> tuple[str | None, str | None]:
    """``(why it will repeat, None)``: stop; ``(None, why not)``: the failure looked
    deterministic but hit only some ranks, restart it and say why; ``(None, None)``: restart.

    The same failure at the same place as the attempt before stops whatever the ranks say:
    a race that loses twice the same way is not worth a third try.
    """
    repeat = will_repeat(failure, progressed, previous, previous_attempt, rule)
    if repeat is None or failure.same_as(previous) or (failure.exception or "") in rule.never:
        return repeat, None
    lone = spread(failure, ends)
    if lone is None:
        return repeat, None
    return None, f"{failure.name()} {lone}"


def will_repeat(failure: Failure, progressed: bool, previous: Failure | None, previous_attempt: int | None,
                rule: RestartOnSpec) -> str | None:
    """Why ``failure`` will repeat (the rest of ``not restarting: ...``), or None: restart it.

    ``progressed``: a step completed in this attempt; ``previous``: the failure of the attempt
    before (number ``previous_attempt``), None for the first. From one rank's failure alone:
    ``verdict`` weighs every rank's.
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
