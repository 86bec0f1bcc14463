"""``checkpoint_every="auto"``: the checkpoint interval from Young's and Daly's rule.

Checkpoint every tau seconds of training, where with C the training time one checkpoint
costs (its stall) and M the mean time between failures,

    Young (1974):  tau = sqrt(2 C M)
    Daly (2006):   tau = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C   (C < 2M; else M)

minimises the expected time lost to checkpoints plus the work redone after a failure. C is
measured: the median stall of this run's saves. M comes from the run records the launcher
keeps (``logs/<run-id>/events*.jsonl``; the worker finds them beside its progress record):
this run's attempts and every earlier run of the same job name under the same log directory
(this machine's, or a shared one). M = time the attempts ran / (failures + 1): failures are
attempts that ended with an exit code other than 0 and 75 (a preemption loses no work); the
+1 keeps the estimate finite and pessimistic before the first failure, and lets it grow with
every failure-free hour. The result is clamped to ``[min_s, max_s]`` (the user's bounds) and
turned into steps with the measured step time, so that every rank, which gets rank 0's
answer, checkpoints at the same step. No torch here.
"""

from __future__ import annotations

import glob
import json
import math
import os
import time
from dataclasses import dataclass

from clusterddp.protocol import EVENTS_GLOB

#: The latest choice of a run, beside its event log (``clusterddp report`` prints it).
INTERVAL_FILE = "checkpoint_interval.json"
#: Exits that lose no work: success, and a preemption that wrote its checkpoint.
HARMLESS_EXITS = (0, 75)


@dataclass(frozen=True)
class History:
    """Failures seen and the time the attempts ran, over the runs read."""

    failures: int = 0
    exposure_s: float = 0.0
    runs: int = 0

    @property
    def mtbf_s(self) -> float:
        return self.exposure_s / (self.failures + 1)


@dataclass(frozen=True)
class Choice:
    """The interval chosen, and everything it was chosen from (for the line and the report)."""

    every_steps: int
    interval_s: float
    optimum_s: float
    stall_s: float
    step_s: float
    history: History
    min_s: float
    max_s: float

    def line(self, job: str | None) -> str:
        h = self.history
        bound = (" (the minimum)" if self.interval_s <= self.min_s and self.optimum_s < self.min_s
                 else " (the maximum)" if self.interval_s >= self.max_s and self.optimum_s > self.max_s
                 else "")
        return (f"checkpoint_every auto: every {self.every_steps} steps = {self.interval_s:.1f}s"
                f"{bound}; Young/Daly optimum {self.optimum_s:.1f}s from a checkpoint stall of "
                f"{self.stall_s:.3f}s and an MTBF of {h.mtbf_s / 3600:.2f}h ({h.failures} "
                f"failure(s) in {h.exposure_s / 3600:.2f}h of attempts over {h.runs} run(s)"
                f"{' of job ' + repr(job) if job else ''}); bounds {self.min_s:g}-{self.max_s:g}s, "
                f"step {self.step_s:.3f}s")


def daly(stall_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum interval (seconds of work between checkpoints)."""
    if stall_s <= 0:
        return 0.0
    if stall_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = stall_s / (2 * mtbf_s)
    return math.sqrt(2 * stall_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - stall_s


def young(stall_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum, sqrt(2 C M)."""
    return math.sqrt(2 * max(stall_s, 0.0) * mtbf_s)


def choose(stall_s: float, step_s: float, history: History, min_s: float,
           max_s: float) -> Choice:
    """The interval in steps (at least 1) for the measured stall and step time."""
    optimum = daly(stall_s, history.mtbf_s) if history.exposure_s > 0 else max_s
    interval = min(max_s, max(min_s, optimum))
    steps = max(1, round(interval / step_s)) if step_s > 0 else 1
    return Choice(steps, interval, optimum, stall_s, step_s, history, min_s, max_s)


def read_history(run_dir: str | None, job: str | None, now: float | None = None) -> History:
    """Failures and attempt time of this run (``run_dir``) and of the earlier runs of ``job``
    beside it; an empty history when there are no records (not under the launcher)."""
    if not run_dir:
        return History()
    now = time.time() if now is None else now
    runs = [run_dir] + [d for d in sorted(glob.glob(os.path.join(os.path.dirname(run_dir), "*")))
                        if os.path.normpath(d) != os.path.normpath(run_dir)]
    failures, exposure, counted = 0, 0.0, 0
    for directory in runs:
        events = _events(directory)
        if not events:
            continue
        jobs = {e.get("job") for e in events if e.get("kind") == "run_start"}
        if directory != run_dir and (job is None or job not in jobs):
            continue
        counted += 1
        begun: dict[int, float] = {}
        for event in events:
            kind, attempt, t = event.get("kind"), event.get("attempt", 0), event.get("t")
            if not isinstance(t, (int, float)) or not isinstance(attempt, int):
                continue
            if kind == "attempt_start":
                begun.setdefault(attempt, float(t))
            elif kind == "attempt_end" and attempt in begun:
                exposure += max(0.0, float(t) - begun.pop(attempt))
                if event.get("exit_code") not in HARMLESS_EXITS:
                    failures += 1
        if directory == run_dir:  # the attempt running now
            exposure += sum(max(0.0, now - t) for t in begun.values())
    return History(failures, exposure, counted)


def _events(directory: str) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    for path in sorted(glob.glob(os.path.join(directory, EVENTS_GLOB))):
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(event, dict):
                        events.append(event)
        except OSError:
            continue
    return sorted(events, key=_time)


def _time(event: dict[str, object]) -> float:
    t = event.get("t")
    return float(t) if isinstance(t, (int, float)) else 0.0


def run_dir_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The launcher's run directory: where this rank's progress record lives."""
    from clusterddp.protocol import HEARTBEAT_FILE_ENV
    path = (os.environ if environ is None else environ).get(HEARTBEAT_FILE_ENV)
    return os.path.dirname(path) if path else None
