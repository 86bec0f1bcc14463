"""What happened to each worker, and the root-cause report printed at the end.

The root cause is the first failure observed, as in torch elastic's ChildFailedError; unlike
it, the report always names the host and the log file and shows the last lines of stderr (or
the traceback a ``@record``-decorated script wrote to TORCHELASTIC_ERROR_FILE).
"""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass, field

from clusterddp.exitcodes import PREEMPTED
from clusterddp.launch.observe.logs import visible_text
from clusterddp.redact import scrub


@dataclass
class WorkerExit:
    """How one worker ended."""

    host: str
    rank: int
    local_rank: int
    pid: int
    returncode: int
    log: str
    tail: list[str] = field(default_factory=list)
    at: float = 0.0
    #: True when clusterddp itself stopped this worker (teardown), so it is not a cause.
    stopped_by_us: bool = False
    #: Why its log file is incomplete (the disk filled up, ...); None when it is whole.
    log_error: str | None = None

    @property
    def signal_name(self) -> str | None:
        if self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    @property
    def exit_code(self) -> int:
        """Shell convention: 128 + signal number for a worker killed by a signal."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def outcome(self) -> str:
        if self.signal_name:
            return f"killed by {self.signal_name}"
        return f"exit code {self.returncode}"

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data.update(exit_code=self.exit_code, signal=self.signal_name)
        return data


def read_error_file(path: str) -> list[str]:
    """The message and traceback torch's ``@record`` wrote, as lines masked of secrets (they
    go to the report and to the SSH head); [] when absent."""
    return [scrub(line) for line in _error_file_lines(path)]


def _error_file_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return []
    message = data.get("message", data)
    if isinstance(message, str):
        return message.splitlines()
    lines: list[str] = []
    extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
    if isinstance(callstack, str):
        lines.extend(callstack.rstrip().splitlines())
    elif isinstance(message, dict) and isinstance(message.get("message"), str):
        lines.extend(message["message"].splitlines())
    return lines


def format_root_cause(job_name: str, exits: list[WorkerExit], root: WorkerExit | None, reason: str | None) -> str:
    """The human report: root cause first, then one line per other worker."""
    if root is None and reason is None:
        return ""
    lines = []
    if root is not None and root.exit_code == PREEMPTED:
        lines.append(f"clusterddp: job '{job_name}' preempted: rank {root.rank} on {root.host} saved a "
                     f"checkpoint and exited {PREEMPTED}; requeue the job to resume")
    elif root is not None:
        lines.append(f"clusterddp: job '{job_name}' failed: rank {root.rank} on {root.host} {root.outcome()}")
    if root is not None:
        lines.append("  root cause (first observed failure):" if root.exit_code != PREEMPTED else "  first to stop:")
        lines.append(f"    host:       {root.host}")
        lines.append(f"    rank:       {root.rank} (local rank {root.local_rank})")
        lines.append(f"    pid:        {root.pid}")
        lines.append(f"    exit:       {root.outcome()}")
        note = f" (incomplete: {root.log_error})" if root.log_error else ""
        lines.append(f"    log:        {root.log}{note}")
        if root.tail:
            # A worker's own words: control characters shown, never acted on by the terminal.
            lines.append("    last lines:")
            lines.extend(f"      {visible_text(line)}" for line in root.tail)
    else:
        lines.append(f"clusterddp: job '{job_name}' stopped: {reason}")
    others = [e for e in exits if e is not root]
    if others:
        lines.append("  other workers:")
        for e in sorted(others, key=lambda e: e.rank):
            note = " (stopped by clusterddp)" if e.stopped_by_us else ""
            lines.append(f"    rank {e.rank} on {e.host}: {e.outcome()}{note}")
    return "\n".join(lines)
