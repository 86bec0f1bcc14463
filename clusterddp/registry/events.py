"""What a run's own files say about it: attempts, the root cause, whether it is restarting,
whether a stop ended it, its hosts (``launcher.json`` of the SSH head). Read from the run
directory's event log (``clusterddp.events``), the same record ``clusterddp report`` reads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from clusterddp.events import read_events
from clusterddp.protocol import BadLauncherFile, read_launcher_file
from clusterddp.validate import clip


@dataclass
class Summary:
    attempts: int = 0
    root_cause: str = ""
    #: The last attempt ended with a restart to come, and the next has not started.
    restarting: bool = False
    #: A stop (a signal, the session's end) ended the run.
    stopped: bool = False
    ended: bool = False
    exit_code: int | None = None
    hosts: list[str] = field(default_factory=list)


def summarise(run_dir: str) -> Summary:
    """The run's summary from its events (the owner's file first: ``node`` None)."""
    summary = Summary()
    if not run_dir or not os.path.isdir(run_dir):
        return summary
    events, _ = read_events(run_dir)
    owner = [e for e in events if e.get("node") is None] or events
    summary.attempts = len({e.get("attempt", 0) for e in owner if e.get("kind") == "attempt_start"})
    last_kind = ""
    causes: dict[int, list[tuple[float, str]]] = {}  # attempt -> (failed at, cause) of each node
    for event in owner:
        kind = event.get("kind")
        if kind == "attempt_end":
            if event.get("exit_code") and event.get("root_cause"):
                at = event.get("failed_at")
                when = float(at) if isinstance(at, (int, float)) else float(event["t"])
                causes.setdefault(int(event.get("attempt") or 0), []).append((when, _cause(event)))
            last_kind = "restart" if event.get("verdict") == "restart" else "end"
        elif kind == "attempt_start":
            last_kind = "start"
        elif kind == "stop":
            summary.stopped = True
        elif kind == "run_end":
            summary.ended = True
            code = event.get("exit_code")
            summary.exit_code = code if type(code) is int else None
    if causes:  # the last failed attempt's first failure (a node's peers then end by its stop)
        summary.root_cause = min(causes[max(causes)])[1]
    summary.restarting = last_kind == "restart" and not summary.ended
    try:
        launcher = read_launcher_file(run_dir)
    except BadLauncherFile:
        launcher = None
    hosts = launcher.get("hosts") if launcher else None
    if isinstance(hosts, list) and all(isinstance(h, str) for h in hosts):
        summary.hosts = [clip(h, 253) for h in hosts[:4096]]
    return summary


def _cause(event: dict[str, object]) -> str:
    """One line: where it failed and with what (``rank 1 on n2 exit code 3: ValueError at
    train.py:3``)."""
    parts = [str(event[key]).strip() for key in ("root_cause", "failure")
             if isinstance(event.get(key), str) and str(event[key]).strip()]
    line = ": ".join(part.splitlines()[0] for part in parts)
    return clip(line, 300)
