"""``clusterddp report [RUN_ID]``: a run's timeline, ETTR and goodput, from its event log.

The wall clock of the run runs from the start of the first ``clusterddp`` process (its
``run_start``'s ``process_start``: the interpreter's own start-up is the user's time too; the
first event where that is missing) to the last ``run_end`` (or the last event of a run whose
launcher was killed). It is cut at every event boundary, and each piece is given the one
label that explains it, the first that applies of:

1. ``hang waits``: from ``timeout_s`` before a ``hang`` (the stall it waited out) to the end
   of that attempt;
2. ``start-up``: from ``run_start`` to the first attempt's first completed step (an attempt
   that completes none is start-up to its end);
3. ``restarts``: from a failure (the failed worker's exit, ``failed_at``) to the next
   attempt's first completed step: teardown, backoff, a new start, restoring the checkpoint;
4. ``checkpoints``, ``evaluation``, other phases by name: a ``phase`` the ranks announced,
   from the first rank's start to the last rank's end (any node); with async checkpoints
   the ``checkpoint`` phase is the staging only, so ``checkpoints`` is the training stall;
5. ``redone``: from a restarted attempt's first step to the moment its step numbers passed
   the highest an earlier attempt reached (the launcher's ``redone`` event): the steps
   between the checkpoint it resumed from and the failure, run a second time;
6. ``training``: from an attempt's first completed step to its end;
7. ``shut-down``: everything else (after the last attempt, before ``run_end``).

So the parts add up to the wall clock by construction. **ETTR** (effective training time
ratio, Meta's measure for Llama 3) is useful training / wall clock: ``training`` only.
**Goodput** is the job's own useful work / wall clock: ``training`` plus ``evaluation`` and
the other phases the job announced; everything else is lost time, split into start-up,
restarts, redone, checkpoint stall, hang waits and shut-down (``--json``: ``lost_s``). What
it cannot see: a phase shorter than the launcher's read interval (0.25 s) may go unseen and
count as training; redone work of a whole-job restart (a new launcher process) is not
recognised, as that launcher does not know the earlier one's steps.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from clusterddp.errors import ClusterDDPError
from clusterddp.events import finite_time, read_events
from clusterddp.protocol import EVENTS_FILE, EVENTS_GLOB
from clusterddp.validate import clip, shown

#: Labels in the order of the breakdown (training first); ``hang waits`` wins over all.
ORDER = ("training", "start-up", "restarts", "redone", "hang waits", "checkpoints", "evaluation",
         "shut-down")
#: Lost time as the issue names it: label in ``parts`` -> key in ``--json``'s ``lost_s``.
#: (``exit``: the phase the ranks announce once the script has returned, part of shutting down.)
LOST = {"start-up": "start-up", "restarts": "restart", "redone": "redone",
        "checkpoints": "checkpoint stall", "hang waits": "hang wait", "shut-down": "shut-down",
        "exit": "shut-down"}
PHASE_LABELS = {"checkpoint": "checkpoints", "eval": "evaluation", "restore": "restarts"}


@dataclass(frozen=True)
class ReportOptions:
    """What ``clusterddp report`` was asked."""

    #: Run id or directory; None: the newest run under ``log_dir``.
    target: str | None = None
    log_dir: str = "logs"
    json: bool = False


@dataclass
class Goodput:
    """The breakdown of one run's wall clock."""

    run_dir: str
    start: float
    end: float
    parts: dict[str, float] = field(default_factory=dict)
    attempts: int = 0
    problems: list[str] = field(default_factory=list)
    finished: bool = True

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def ettr(self) -> float:
        """Useful training time / wall clock (redone steps are not useful)."""
        return self.parts.get("training", 0.0) / self.wall if self.wall > 0 else 0.0

    @property
    def goodput(self) -> float:
        """The job's own work (training, evaluation, its other phases) / wall clock."""
        useful = sum(v for k, v in self.parts.items() if k not in LOST and k != "restore")
        return useful / self.wall if self.wall > 0 else 0.0

    @property
    def lost(self) -> dict[str, float]:
        lost = dict.fromkeys(LOST.values(), 0.0)
        for label, name in LOST.items():
            lost[name] += self.parts.get(label, 0.0)
        return lost


def find_run(target: str | None, log_dir: str) -> str:
    """The run directory of ``target`` (a run id under ``log_dir``, or a directory), or the
    newest run under ``log_dir`` that has an event log."""
    if target:
        for candidate in (os.path.join(log_dir, target), target):
            if os.path.isdir(candidate):
                return candidate
        raise ClusterDDPError(f"report: no run {shown(target)} under {clip(log_dir)}/")
    runs = [os.path.join(log_dir, name) for name in _listdir(log_dir)]
    runs = [run for run in runs if os.path.isfile(os.path.join(run, EVENTS_FILE))
            or any(fnmatch.fnmatchcase(n, EVENTS_GLOB) for n in _listdir(run))]
    if not runs:
        raise ClusterDDPError(f"report: no run with an event log under {clip(log_dir)}/")
    return max(runs, key=os.path.getmtime)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _at(event: dict[str, Any], key: str = "at") -> float:
    """The event's ``key`` time, or its ``t`` when that is missing or not a time."""
    value = finite_time(event.get(key))
    return float(event["t"]) if value is None else value


def intervals(events: list[dict[str, Any]], end: float,
              start: float | None = None) -> list[tuple[float, float, str]]:
    """(start, end, label) spans the events show; overlapping spans are resolved by ``breakdown``.
    ``start``: the run's start (default: the first event)."""
    spans: list[tuple[float, float, str]] = []
    start = events[0]["t"] if start is None else start
    attempt_begin: dict[int, float] = {}
    first_step: dict[int, float] = {}
    attempt_end: dict[int, float] = {}
    failed_at: dict[int, float] = {}
    open_phase: dict[tuple[str, Any], float] = {}
    redone_until: dict[int, float] = {}
    for event in events:
        kind, attempt = event["kind"], event.get("attempt", 0)
        if kind == "attempt_start":
            attempt_begin.setdefault(attempt, event["t"])
        elif kind == "first_step":
            first_step[attempt] = min(first_step.get(attempt, _at(event)), _at(event))
        elif kind == "attempt_end":
            attempt_end[attempt] = max(attempt_end.get(attempt, event["t"]), event["t"])
            if event.get("exit_code"):
                failed_at.setdefault(attempt, _at(event, "failed_at") if event.get("failed_at") else event["t"])
        elif kind == "redone" and finite_time(event.get("until")) is not None:
            redone_until[attempt] = max(redone_until.get(attempt, 0.0), float(event["until"]))
        elif kind == "hang":
            failed_at[attempt] = min(failed_at.get(attempt, event["t"]), event["t"])
            wait = finite_time(event.get("timeout_s")) or 0.0
            spans.append((event["t"] - wait, event["t"], "hang waits"))
        elif kind == "phase":
            key = (clip(str(event.get("name"))), event.get("node"))
            if event.get("edge") == "span":
                spans.append((_at(event), _at(event, "until"), PHASE_LABELS.get(key[0], key[0])))
            elif event.get("edge") == "start":
                open_phase[key] = _at(event)
            elif key in open_phase:
                label = PHASE_LABELS.get(key[0], key[0])
                spans.append((open_phase.pop(key), _at(event) if event.get("at") else event["t"], label))
    for (name, _), began in open_phase.items():
        spans.append((began, end, PHASE_LABELS.get(name, name)))
    ordered = sorted(attempt_begin)
    previous_failure: float | None = None
    for attempt in ordered:
        stop = attempt_end.get(attempt, end)
        stepped = first_step.get(attempt)
        ready = stepped if stepped is not None else stop
        if previous_failure is None:
            spans.append((start, ready, "start-up"))
        else:
            spans.append((previous_failure, ready, "restarts"))
        if stepped is not None:
            spans.append((stepped, stop, "training"))
            if attempt in redone_until:
                spans.append((stepped, min(stop, redone_until[attempt]), "redone"))
        if attempt in failed_at:
            spans.append((failed_at[attempt], stop, "hang waits" if _hung(events, attempt) else "restarts"))
            previous_failure = failed_at[attempt]
        else:
            previous_failure = None if attempt == ordered[-1] else stop
    return spans


def _hung(events: list[dict[str, Any]], attempt: int) -> bool:
    return any(e["kind"] == "hang" and e.get("attempt", 0) == attempt for e in events)


def breakdown(spans: list[tuple[float, float, str]], start: float, end: float) -> dict[str, float]:
    """Seconds per label: each moment of [start, end] counted once, under the label of
    highest priority covering it (``_priority``), ``shut-down`` where none does."""
    cuts = sorted({start, end, *(max(start, min(end, t)) for s, e, _ in spans for t in (s, e))})
    parts: dict[str, float] = {}
    for left, right in zip(cuts, cuts[1:]):
        if right <= left:
            continue
        middle = (left + right) / 2
        covering = [label for s, e, label in spans if s <= middle < e]
        label = min(covering, key=_priority) if covering else "shut-down"
        parts[label] = parts.get(label, 0.0) + right - left
    return parts


def _priority(label: str) -> int:
    ranks = {"hang waits": 0, "start-up": 1, "restarts": 2, "redone": 7, "training": 9}
    return ranks.get(label, 5)  # checkpoints, evaluation, other phases: between


def analyse(run_dir: str) -> tuple[Goodput, list[dict[str, Any]]]:
    """The run's breakdown and its events (merged from every node's file)."""
    events, problems = read_events(run_dir)
    if not events:
        raise ClusterDDPError(f"report: {clip(run_dir)}: no events" + (f" ({clip(problems[0], 200)})" if problems else ""))
    ends = [e["t"] for e in events if e["kind"] == "run_end"]
    finished = bool(ends)
    end = max(ends) if ends else max(e["t"] for e in events)
    started = [finite_time(e.get("process_start")) for e in events if e["kind"] == "run_start"]
    start = min([e["t"] for e in events] + [t for t in started if t is not None])
    spans = intervals(events, end, start)
    result = Goodput(run_dir=run_dir, start=start, end=end, parts=breakdown(spans, start, end),
                     attempts=len({e.get("attempt", 0) for e in events if e["kind"] == "attempt_start"}),
                     problems=problems, finished=finished)
    return result, events


def timeline_line(event: dict[str, Any], start: float) -> str:
    """One event as a line of the timeline: offset, node, kind, what matters of it."""
    skip = {"t", "kind", "node", "host", "attempt", "file"}
    details = " ".join(f"{clip(str(k), 40)}={_short(v)}" for k, v in event.items() if k not in skip and v is not None)
    where = clip(event.get("host") or "?", 40)
    kind = clip(event["kind"], 40)
    return f"  {event['t'] - start:9.2f}s  {where:<12} attempt {event.get('attempt', 0)}  {kind:<13} {details}"


def _short(value: Any) -> str:
    """A field's value for the timeline: one line of at most about 100 characters, control
    characters escaped (an events file is text anyone who can write the log directory wrote)."""
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1e15 else repr(value)
    return clip(value if isinstance(value, str) else json.dumps(value), 100)


#: Lines of a shipped tree's uncommitted diff the report shows (the file has all of it).
DIFF_LINES = 40


def code_lines(run_dir: str, events: list[dict[str, Any]]) -> list[str]:
    """The code a run used (the SSH head's ``code`` event): tree hash, git commit, and the
    uncommitted diff it kept beside the log (scrubbed when written), its first lines."""
    code = next((e for e in events if e.get("kind") == "code"), None)
    if code is None:
        return []
    commit = clip(str(code.get("git_commit") or "none (not a git work tree)"), 60)
    lines = [f"code: tree {clip(str(code.get('tree')), 64)}, git commit {commit}"
             + (", with uncommitted changes" if code.get("dirty") else "")]
    name = code.get("diff")
    if isinstance(name, str) and os.path.basename(name) == name and name:
        try:
            with open(os.path.join(run_dir, name), encoding="utf-8", errors="replace") as f:
                diff = f.read().splitlines()
        except OSError:
            diff = []
        lines.append(f"  uncommitted diff ({len(diff)} lines, {os.path.join(run_dir, name)}):")
        lines.extend(f"    {clip(line, 200)}" for line in diff[:DIFF_LINES])
        if len(diff) > DIFF_LINES:
            lines.append(f"    ... {len(diff) - DIFF_LINES} more lines")
    return lines


def render(result: Goodput, events: list[dict[str, Any]]) -> str:
    """The human report: timeline, then the breakdown with its sum against the wall clock."""
    lines = [f"run {clip(os.path.basename(os.path.normpath(result.run_dir)))} ({clip(result.run_dir)}), started "
             f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(result.start))}, {result.attempts} attempt(s)"]
    lines.extend(code_lines(result.run_dir, events))
    lines.append("timeline:")
    lines.extend(timeline_line(e, result.start) for e in events)
    if not result.finished:
        lines.append("  (no run_end: the launcher is still running or was killed; the wall clock ends at the last event)")
    lines.append(f"ETTR: {100 * result.ettr:.1f}% (useful training {result.parts.get('training', 0.0):.2f}s "
                 f"of {result.wall:.2f}s wall clock, from the first clusterddp process start)")
    lines.append(f"goodput: {100 * result.goodput:.1f}% (training, evaluation and the job's other phases)")
    lost = result.lost
    lines.append(f"lost: {sum(lost.values()):.2f}s = " + ", ".join(
        f"{name} {seconds:.2f}s" for name, seconds in lost.items()))
    labels = [label for label in ORDER if label in result.parts] + sorted(set(result.parts) - set(ORDER))
    for label in labels:
        seconds = result.parts[label]
        share = 100 * seconds / result.wall if result.wall > 0 else 0.0
        lines.append(f"  {clip(label, 40):<12} {seconds:9.2f}s  {share:5.1f}%")
    total = sum(result.parts.values())
    lines.append(f"  {'sum':<12} {total:9.2f}s  (wall clock {result.wall:.2f}s)")
    interval = checkpoint_interval(result.run_dir)
    if interval is not None:
        lines.append(f"checkpoint interval: {clip(str(interval.get('line')), 400)}")
    lines.extend(f"note: {clip(problem, 200)}" for problem in result.problems)
    return "\n".join(lines)


def checkpoint_interval(run_dir: str) -> dict[str, Any] | None:
    """The interval ``checkpoint_every="auto"`` chose last, with why (clusterddp.train writes
    ``checkpoint_interval.json`` beside the event log); None without one."""
    try:
        with open(os.path.join(run_dir, "checkpoint_interval.json")) as f:
            data = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def as_json(result: Goodput, events: list[dict[str, Any]]) -> str:
    return json.dumps({"run_dir": result.run_dir, "start": result.start, "end": result.end,
                       "wall_s": result.wall, "ettr": result.ettr, "goodput": result.goodput,
                       "lost_s": result.lost, "parts_s": result.parts,
                       "attempts": result.attempts, "finished": result.finished,
                       "checkpoint_interval": checkpoint_interval(result.run_dir),
                       "problems": result.problems, "events": events}, indent=1)


def report_main(options: ReportOptions) -> int:
    """Print the report of one run; exit 0 (a missing run or log is an error, exit 2)."""
    run_dir = find_run(options.target, options.log_dir)
    result, events = analyse(run_dir)
    print(as_json(result, events) if options.json else render(result, events))
    return 0
