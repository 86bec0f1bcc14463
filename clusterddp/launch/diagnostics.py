"""Where is each rank: stacks on request and the hang check, as hooks the supervisor calls.

The supervisor owns none of this logic: on its tick it hands the hooks the state of its
ranks (``workers.RankState``, plain data) and acts on what they answer (a stop reason).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from clusterddp.atomicfile import WriteError
from clusterddp.hang import RankLife, culprit, last_progress, stalled_for
from clusterddp.launch.stackdump import Target, collect
from clusterddp.launch.workers import RankState
from clusterddp.protocol import stacks_block_title, stacks_line, write_stacks_report
from clusterddp.stackreport import StacksReport, build_report

StacksHook = Callable[[Sequence[RankState], str], "StacksReport | None"]


@dataclass(frozen=True)
class DiagnosticHooks:
    """What the supervisor calls; built by ``default_hooks``, replaced freely in tests."""

    #: Dump the stacks of the live ranks; ``why``: "requested" or "hang". None: nothing to dump.
    stacks: StacksHook
    #: On every tick: a stop reason when no rank made progress for too long, else None.
    hang: Callable[[Sequence[RankState]], str | None]
    #: At the start of every attempt (the hang clock starts again).
    new_attempt: Callable[[], None]


class StacksDump:
    """Every live rank's stack, grouped on stderr, in full under the run dir."""

    def __init__(self, host: str, run_dir: str | None, say: Callable[[str], None],
                 emit: Callable[[str], None] | None = None) -> None:
        self.host = host
        self.run_dir = run_dir
        self._say = say
        #: Where the machine-readable stacks line goes (stdout, for the SSH head); None: nowhere.
        self._emit = emit

    def __call__(self, ranks: Sequence[RankState], why: str) -> StacksReport | None:
        targets = [Target(rank=r.rank, pid=r.pid, stacks_file=r.stacks_file or "")
                   for r in ranks if r.running and r.stacks_file]
        if not targets:
            return None
        report = build_report(collect(targets), self.host)
        path, problem = None, None
        try:
            path = write_stacks_report(report.full_text, self.run_dir) if self.run_dir else None
        except WriteError as exc:  # a full log disk must not turn a diagnosis into a crash
            problem = exc.strerror
        lines = [stacks_block_title(len(targets), self.host, why)]
        lines.extend(f"  {line}" for line in report.lines)
        if path:
            lines.append(f"  full dump: {path}")
        if problem:
            lines.append(f"  full dump not written: {problem}")
        self._say("\n".join(lines))
        if self._emit is not None:
            waiting = sorted(r for r, w in report.where.items() if w.in_collective)
            self._emit(stacks_line(self.host, why, report.summaries(), waiting, path))
        return report


class HangCheck:
    """No rank made progress (a line, a heartbeat) for ``timeout`` seconds: dump, name a culprit."""

    def __init__(self, timeout: float | None, stacks: StacksHook,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._stacks = stacks
        self._clock = clock
        self._attempt_started = clock()
        #: monotonic time of the attempt's first sign of life (None: every rank still starting)
        self._first_life: float | None = None

    def new_attempt(self) -> None:
        self._attempt_started = self._clock()
        self._first_life = None

    def __call__(self, ranks: Sequence[RankState]) -> str | None:
        timeout = self.timeout
        if not timeout:
            return None
        lives = [RankLife(r.rank, r.last_line_at, r.heartbeat_file) for r in ranks if not r.exited]
        progress = last_progress(lives, since=self._attempt_started)
        now = self._clock()
        if self._first_life is None and (any(t is not None for t in progress.values())
                                         or any(r.exited or r.last_line_at for r in ranks)):
            self._first_life = now
        # The clock starts at the job's first sign of life (a line, a heartbeat, or a rank's
        # exit), so importing torch on a busy node is never a hang; from then on a rank that
        # never printed counts from that moment: a silent rank left alone by peers that
        # exited (even silently) does not wait forever.
        stalled = stalled_for(progress, now, since=self._first_life)
        if stalled is None or stalled <= timeout:
            return None
        report = self._stacks(ranks, "hang")
        return (f"hang: no rank made progress for {stalled:.0f}s (hang_timeout {timeout:g}s); "
                + culprit(progress, report.where if report else {}))


def default_hooks(host: str, run_dir: str | None, hang_timeout: float | None, say: Callable[[str], None],
                  emit: Callable[[str], None] | None) -> DiagnosticHooks:
    """Stacks to stderr (and ``emit``), full dumps under ``run_dir``; the hang check on them."""
    stacks = StacksDump(host, run_dir, say, emit)
    hang = HangCheck(hang_timeout, stacks)
    return DiagnosticHooks(stacks=stacks, hang=hang, new_attempt=hang.new_attempt)
