"""``clusterddp ls`` and ``clusterddp status RUN``: a record, with what is true *now*.

Most records are of finished runs and are shown as recorded (no platform is asked: 1,000
records are read in well under a second, benchmarks/runs_ls.py). A record still marked
running is checked where that is cheap: a local or SSH run's launcher (or head) must still be
the recorded process (``procid``: a pid alone may name a stranger by now), else the run is
``lost``; its events say whether it is between attempts (``restarting``). Scheduler runs are
refreshed by the caller, one platform call per target (``Refresher``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from clusterddp.procid import why_not_running
from clusterddp.registry.events import summarise
from clusterddp.registry.store import FINAL, RunRecord
from clusterddp.validate import clip, escape_controls

#: run_dir -> goodput (0..1) or None: the caller's (``clusterddp report``'s arithmetic).
Goodput = Callable[[str], "float | None"]


@dataclass
class Row:
    record: RunRecord
    state: str
    #: Why the state is what it is, when the record alone would say otherwise (lost: why).
    note: str = ""
    attempts: int = 1
    goodput: float | None = None
    root_cause: str = ""

    def duration(self, now: float) -> float | None:
        if not self.record.started:
            return None
        end = self.record.ended if self.record.ended is not None else (now if self.state not in FINAL else None)
        return None if end is None else max(0.0, end - self.record.started)

    def where(self) -> str:
        r = self.record
        if r.target in ("local", "ssh"):
            return ",".join(r.hosts)
        parts = [p for p in (f"job {r.job_id}" if r.job_id else "", f"on {','.join(r.hosts)}" if r.hosts else "",
                             r.where) if p]
        return " ".join(parts)

    def as_json(self, now: float) -> dict[str, Any]:
        r = self.record
        return {"run_id": r.run_id, "target": r.target, "job": r.job, "where": self.where(), "hosts": r.hosts,
                "job_id": r.job_id or None, "state": self.state, "note": self.note or None,
                "attempts": self.attempts, "started": r.started, "ended": r.ended,
                "duration_s": _round(self.duration(now)), "exit_code": r.exit_code,
                "root_cause": self.root_cause or None, "goodput": _round(self.goodput, 4), "run_dir": r.run_dir,
                "detached": r.detached}


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def live(record: RunRecord, goodput: Goodput | None = None) -> Row:
    """The record's row, checked where that is cheap (see the module's docstring)."""
    row = Row(record, record.state, attempts=record.attempts, goodput=record.goodput, root_cause=record.root_cause)
    if record.state in FINAL or record.target not in ("local", "ssh"):
        return row
    if record.head:  # a detached SSH head: its host answers (launch.remotehead), not this one
        row.note = f"its head runs on {record.head.get('host', '?')}: asked over SSH"
        return row
    identity = record.identity()
    why = why_not_running(identity) if identity is not None else "the record names no launcher"
    if why is None and identity is not None and zombie(identity.pid):
        why = f"pid {identity.pid} has exited"
    summary = summarise(record.run_dir)
    row.attempts = max(summary.attempts, 1)
    row.root_cause = summary.root_cause or record.root_cause
    if why is not None and identity is not None and identity.host != _host():
        row.note = f"not checked: {why}"
    elif why is not None:
        row.state = "lost"
        row.note = f"its launcher is gone without recording an end ({why})"
    elif summary.restarting:
        row.state = "restarting"
    if goodput is not None:
        row.goodput = goodput(record.run_dir)
    return row


def zombie(pid: int) -> bool:
    """The launcher has exited and waits for its parent to reap it (a shell, a test): it is
    over, though its pid and start time still stand in /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rpartition(b")")[2].split()
    except OSError:
        return True
    return bool(fields) and fields[0] in (b"Z", b"X")


def _host() -> str:
    import socket

    return socket.gethostname()


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


COLUMNS = ("RUN ID", "TARGET", "WHERE", "STATE", "ATTEMPTS", "STARTED", "DURATION", "EXIT", "GOODPUT",
           "ROOT CAUSE")


def table(rows: Sequence[Row], now: float) -> str:
    """The rows as ``ls`` prints them: aligned columns, one run a line, every field one
    escaped line (a hostile host name or root cause cannot draw on the terminal)."""
    cells = [list(COLUMNS)]
    for row in rows:
        r = row.record
        cells.append([r.run_id, r.target, clip(row.where(), 40), row.state, str(row.attempts), _when(r.started),
                      _duration(row.duration(now)), "-" if r.exit_code is None else str(r.exit_code),
                      "-" if row.goodput is None else f"{row.goodput:.0%}", clip(row.root_cause or row.note, 80)])
    cells = [[c if c.isprintable() else escape_controls(c) for c in line] for line in cells]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells) + "\n"


def as_json(rows: Sequence[Row], now: float, problems: Sequence[str] = ()) -> str:
    return json.dumps({"runs": [row.as_json(now) for row in rows], "skipped": list(problems)}, indent=2) + "\n"


def status_lines(row: Row, now: float) -> list[str]:
    """``clusterddp status RUN`` for any target, from its row."""
    data = row.as_json(now)
    data["started"] = _when(row.record.started)
    data["ended"] = _when(row.record.ended) if row.record.ended else None
    data["goodput"] = None if row.goodput is None else f"{row.goodput:.0%}"
    order = ("run_id", "state", "note", "target", "job", "where", "attempts", "started", "ended", "duration_s",
             "exit_code", "root_cause", "goodput", "run_dir")
    return [f"{key + ':':12s} {escape_controls(clip(str(data[key]), 300))}" for key in order
            if data.get(key) is not None]


def merge(rows: list[Row], refreshed: Mapping[str, Mapping[str, Any]]) -> None:
    """Apply what a platform said (run id -> changed fields) to the rows."""
    for row in rows:
        change = refreshed.get(row.record.run_id)
        if not change:
            continue
        for key, value in change.items():
            if key in ("state", "root_cause", "note", "attempts", "goodput"):
                setattr(row, key, value)
            elif hasattr(row.record, key):
                setattr(row.record, key, value)
