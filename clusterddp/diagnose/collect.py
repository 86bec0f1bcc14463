"""Ask running workers for their stacks and turn the answers into a report.

Each worker's bootstrap appends a faulthandler dump to its own ``rank<R>.stacks`` file when
it receives ``DUMP_SIGNAL``; we remember each file's size, signal, and read what was added
once the file stops growing. A worker stuck in C code that holds the GIL cannot answer in
Python; it is reported as such instead of blocking the report.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from clusterddp.diagnose.stacks import RankWhere, group_report, locate
from clusterddp.launch.bootstrap import DUMP_SIGNAL


@dataclass(frozen=True)
class Target:
    rank: int
    pid: int
    stacks_file: str


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def collect(targets: list[Target], timeout: float = 3.0, settle: float = 0.15) -> dict[int, str]:
    """Signal every target at once and return each rank's new dump text ('' if none came)."""
    offsets = {t.rank: _size(t.stacks_file) for t in targets}
    for target in targets:
        try:
            os.kill(target.pid, DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    last_sizes: dict[int, int] = {}
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        sizes = {t.rank: _size(t.stacks_file) for t in targets}
        if sizes != last_sizes:
            last_sizes, stable_since = sizes, time.monotonic()
        elif all(sizes[r] > offsets[r] for r in sizes) and time.monotonic() - stable_since >= settle:
            break
        time.sleep(0.03)
    dumps = {}
    for target in targets:
        try:
            with open(target.stacks_file, "rb") as f:
                f.seek(offsets[target.rank])
                dumps[target.rank] = f.read().decode(errors="replace")
        except OSError:
            dumps[target.rank] = ""
    return dumps


@dataclass
class StacksReport:
    """Grouped summary lines, per-rank locations, and the full text for the log file."""

    lines: list[str]
    where: dict[int, RankWhere]
    full_text: str

    def summaries(self) -> dict[int, str]:
        return {rank: w.summary for rank, w in self.where.items()}


def build_report(dumps: dict[int, str], host: str) -> StacksReport:
    where = {rank: locate(text) for rank, text in dumps.items()}
    lines = group_report(where)
    full = [f"where each rank is on {host}:"] + [f"  {line}" for line in lines] + [""]
    for rank in sorted(dumps):
        full.append(f"===== rank {rank} on {host} =====")
        full.append(dumps[rank].rstrip() or "(no stack received)")
    return StacksReport(lines=lines, where=where, full_text="\n".join(full) + "\n")


def write_full(report: StacksReport, directory: str) -> str:
    """Keep the whole dump next to the rank logs; return its path."""
    return str(write_stacks_file(report.full_text, Path(directory)))


def write_stacks_file(text: str, directory: Path) -> Path:
    """``stacks-<time>-<pid>.txt`` in the run's log dir, written whole (temp file + rename):
    the name ``clusterddp stacks`` waits for, the pid telling this process's report from
    other hosts' dumps on a shared filesystem."""
    base = f"stacks-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path = directory / f"{base}.txt"
    n = 1
    while path.exists():
        path = directory / f"{base}.{n}.txt"
        n += 1
    tmp = directory / f".{path.name}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
