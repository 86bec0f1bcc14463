"""The run's event log: what happened when, one JSON object per line, from every launcher.

``logs/<run-id>/events.jsonl`` is written by the process that owns the run: a launcher alone
on its machine, or the SSH head. A launcher that is one node of several (started by the SSH
head, by srun under SLURM, in a pod) writes ``events.node<K>.jsonl`` beside it. One file has
one writer at a time, because appends from several *hosts* to one file are not atomic on
NFS and other shared filesystems (O_APPEND is only atomic on a local one); several hosts
may still share the directory. A reader merges every ``events*.jsonl`` of the run directory
by time (``read_events``).

Each line is written with one ``os.write`` on an ``O_APPEND`` descriptor and capped at
``MAX_LINE`` bytes (well under a page), so a process killed at any moment leaves whole lines
and at most a torn last one, which the reader reports and skips. Every event has ``t``
(wall time), ``kind``, ``node``, ``host``, ``attempt``, and fields of its kind (the kinds are
listed in ``KINDS``; docs/diagnose.md describes them). Writing never fails the run: a log
that cannot be written is silently not written. A leaf: standard library only.
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any

#: The run owner's file; nodes of a multi-node run write ``events.node<K>.jsonl``.
EVENTS_FILE = "events.jsonl"
#: A line longer than this is shortened before it is written (one page is 4096 bytes).
MAX_LINE = 2048
#: Longest string field kept whole in a line that had to be shortened.
MAX_FIELD = 240

#: The kinds written by clusterddp itself (other kinds are read back as they are).
KINDS = (
    "run_start",      # the launcher (or head) started: job, ranks, restarts allowed
    "attempt_start",  # an attempt's workers are being started
    "first_step",     # the attempt's first completed step (from the ranks' progress records)
    "phase",          # a rank entered ("start") or left ("end") a phase: checkpoint, eval, ...
    "hang",           # no progress for too long: stalled_s, why
    "straggler",      # one host's ranks slower than the others
    "unannounced_work",  # hang_timeout auto: a stall with no rank in a collective, allowed_s more
    "attempt_end",    # exit code, root cause, verdict ("restart"/"stop") and why
    "restart",        # the next attempt follows after backoff_s
    "stop",           # told to stop from outside (a signal, the SSH session's end)
    "run_end",        # the launcher's exit code
)


def events_file(node: int | None) -> str:
    """The file name a writer uses: ``events.jsonl`` for the run's owner (``node`` None),
    ``events.node<K>.jsonl`` for node K of a multi-node run."""
    return EVENTS_FILE if node is None else f"events.node{node}.jsonl"


class EventLog:
    """Appends events to one file of the run directory; a no-op without one."""

    def __init__(self, run_dir: str | None, node: int | None, host: str) -> None:
        self.node = node
        self.host = host
        #: The attempt events are stamped with (the supervisor moves it on).
        self.attempt = 0
        self.path = os.path.join(run_dir, events_file(node)) if run_dir else None
        self._fd: int | None = None
        if self.path is not None:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                self._fd = None

    def emit(self, kind: str, **fields: Any) -> None:
        """One line: ``t``, ``kind``, ``node``, ``host``, ``attempt``, then ``fields``."""
        if self._fd is None:
            return
        event: dict[str, Any] = {"t": round(time.time(), 3), "kind": kind, "node": self.node,
                                 "host": self.host, "attempt": self.attempt}
        event.update(fields)
        try:
            os.write(self._fd, encode(event))
        except OSError:
            pass

    def attempt_ended(self, exit_code: int, root_cause: str | None, failure: str | None,
                      failed_at: object, backoff: float | None, why: str, stopping: str | None) -> None:
        """An attempt's end as ``clusterddp report`` reads it, from a node's supervisor and from
        the SSH head alike: ``stop`` first when a stop ended it, ``attempt_end`` with its verdict
        and why, then ``restart`` when one follows."""
        if stopping is not None:
            self.emit("stop", why=stopping)
        self.emit("attempt_end", exit_code=exit_code, root_cause=root_cause, failure=failure,
                  failed_at=failed_at, verdict="restart" if backoff is not None else "stop", why=why)
        if backoff is not None:
            self.emit("restart", backoff_s=backoff)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def encode(event: dict[str, Any]) -> bytes:
    """One line of at most ``MAX_LINE`` bytes: long strings cut first, then extra fields dropped."""
    line = json.dumps(event, separators=(",", ":"), default=str).encode() + b"\n"
    if len(line) <= MAX_LINE:
        return line
    short = {k: (v[:MAX_FIELD] + "..." if isinstance(v, str) and len(v) > MAX_FIELD else v)
             for k, v in event.items()}
    short["cut"] = True
    line = json.dumps(short, separators=(",", ":"), default=str).encode() + b"\n"
    if len(line) <= MAX_LINE:
        return line
    core: dict[str, Any] = {k: short[k] for k in ("t", "kind", "node", "host", "attempt") if k in short}
    core["cut"] = True
    return json.dumps(core, separators=(",", ":"), default=str).encode()[:MAX_LINE - 1] + b"\n"


def read_events(run_dir: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every event of every ``events*.jsonl`` in ``run_dir``, merged by time, and the problems
    met: a torn last line (its writer killed mid-write, or the disk full) or a line that is
    not an event is skipped and named, never fatal."""
    events: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in sorted(glob.glob(os.path.join(run_dir, "events*.jsonl"))):
        name = os.path.basename(path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            problems.append(f"{name}: cannot be read: {exc.strerror}")
            continue
        lines = data.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with a newline
        for number, raw in enumerate(lines, 1):
            event = _event(raw)
            if event is None:
                if raw.strip():
                    problems.append(f"{name}:{number}: not an event, skipped")
                continue
            event.setdefault("file", name)
            events.append(event)
        if torn:
            problems.append(f"{name}:{len(lines) + 1}: last line torn ({len(torn)} bytes without "
                            "its newline: its writer was killed mid-write?), skipped")
    events.sort(key=lambda e: e["t"])
    return events, problems


def _event(raw: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
        return None
    t = event.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return None
    return event
