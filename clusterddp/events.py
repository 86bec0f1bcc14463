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
that cannot be written is silently not written. A leaf: the standard library, ``validate``
and ``protocol`` (which spells the files' names: ``events_name``, ``EVENTS_GLOB``).
"""

from __future__ import annotations

import glob
import json
import math
import os
import time
from typing import Any

from clusterddp.protocol import EVENTS_GLOB, events_name
from clusterddp.validate import clip, read_small_file

#: A line longer than this is shortened before it is written (one page is 4096 bytes).
MAX_LINE = 2048
#: Longest string field kept whole in a line that had to be shortened.
MAX_FIELD = 240

#: The kinds written by clusterddp itself (other kinds are read back as they are).
KINDS = (
    "run_start",      # the launcher (or head) started: job, ranks, restarts allowed
    "code",           # the SSH head shipped the code tree: its hash, git commit, dirty, diff file
    "attempt_start",  # an attempt's workers are being started
    "first_step",     # the attempt's first completed step (from the ranks' progress files)
    "phase",          # a rank entered ("start") or left ("end") a phase: checkpoint, eval, ...
    "hang",           # no progress for too long: stalled_s, why
    "straggler",      # one host's ranks slower than the others
    "unannounced_work",  # hang_timeout auto: a stall with no rank in a collective, allowed_s more
    "attempt_end",    # exit code, root cause, verdict ("restart"/"stop") and why
    "restart",        # the next attempt follows after backoff_s
    "redone",         # a restarted attempt's steps up to where an earlier attempt had got: lost work
    "stop",           # told to stop from outside (a signal, the SSH session's end)
    "run_end",        # the launcher's exit code
)


class EventLog:
    """Appends events to one file of the run directory; a no-op without one."""

    def __init__(self, run_dir: str | None, node: int | None, host: str) -> None:
        self.node = node
        self.host = host
        #: The attempt events are stamped with (the supervisor moves it on).
        self.attempt = 0
        self.path = os.path.join(run_dir, events_name(node)) if run_dir else None
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


#: An events file larger than this is skipped, with a note (a run writes a few hundred bytes
#: an event: this is hundreds of thousands of events, and the JSON of them fits in memory).
MAX_FILE_BYTES = 64 << 20
#: A line longer than this is not one of ours (writers cap theirs at ``MAX_LINE``): skipped.
MAX_READ_LINE = 64 << 10
#: Deepest nesting of a field's value that is kept; deeper is not an event (json's decoder and
#: encoder recurse: a line of ``[[[[...`` would end the report with a RecursionError).
MAX_DEPTH = 32
#: Wall-clock times an event may carry: 1970 to the end of year 9999 (what ``time.localtime``
#: and a date can show; -1e308 or 1e308 would overflow them, NaN would break the order).
MAX_TIME = 253402300799.0
#: Problems named one by one; after these, only their number (a file of garbage is one
#: screen of notes, not a million).
MAX_PROBLEMS = 20


def read_events(run_dir: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every event of every ``events*.jsonl`` in ``run_dir``, merged by time, and the problems
    met: a torn last line (its writer killed mid-write, or the disk full) or a line that is
    not an event is skipped and named, never fatal. Only regular files of at most
    ``MAX_FILE_BYTES`` are read: a FIFO would hang the reader, ``/dev/zero`` would fill memory."""
    events: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in sorted(glob.glob(os.path.join(run_dir, EVENTS_GLOB))):
        name = clip(os.path.basename(path))
        try:
            data = read_small_file(path, MAX_FILE_BYTES)
        except OSError as exc:
            problems.append(f"{name}: cannot be read: {exc.strerror}, skipped")
            continue
        except ValueError as exc:
            problems.append(f"{name}: {exc}, skipped")
            continue
        lines = data.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with a newline
        for number, raw in enumerate(lines, 1):
            event, why = _event(raw)
            if event is None:
                if why:
                    problems.append(f"{name}:{number}: {why}, skipped")
                continue
            event.setdefault("file", name)
            events.append(event)
        if torn:
            problems.append(f"{name}:{len(lines) + 1}: last line torn ({len(torn)} bytes without "
                            "its newline: its writer was killed mid-write?), skipped")
    events.sort(key=lambda e: e["t"])
    if len(problems) > MAX_PROBLEMS:
        problems[MAX_PROBLEMS:] = [f"... and {len(problems) - MAX_PROBLEMS} more lines skipped"]
    return events, problems


def _event(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The event of one line, or None and why not (None: a blank line, nothing to say)."""
    if not raw.strip():
        return None, None
    if len(raw) > MAX_READ_LINE:
        return None, f"a line of {len(raw)} bytes (at most {MAX_READ_LINE})"
    try:
        # NaN, Infinity and 1e400 read as null: ``report --json`` stays JSON, sums stay finite.
        event = json.loads(raw, parse_constant=lambda _: None, parse_float=_finite)
    except (ValueError, RecursionError):
        return None, "not an event"
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
        return None, "not an event"
    if _too_deep(event):
        return None, f"nested deeper than {MAX_DEPTH} levels"
    t = event.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TIME:
        return None, f"its time t is not a time between 1970 and 9999 (got {clip(repr(t), 40)})"
    event["t"] = float(t)
    attempt = event.get("attempt", 0)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt < 1 << 31:
        return None, f"its attempt is not a small non-negative integer (got {clip(repr(attempt), 40)})"
    node = event.get("node")
    if node is not None and (isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < 1 << 31):
        return None, f"its node is not a small non-negative integer (got {clip(repr(node), 40)})"
    if not isinstance(event.get("host", ""), (str, type(None))):
        return None, "its host is not a string"
    return event, None


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _too_deep(value: Any) -> bool:
    """True when ``value`` nests lists/dicts deeper than ``MAX_DEPTH`` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth >= MAX_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def finite_time(value: object) -> float | None:
    """A time or duration field (``at``, ``until``, ``failed_at``, ``timeout_s``) as a float when
    it is a number in the range events carry, else None (the reader then uses ``t``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_TIME:
        return None
    return float(value)
