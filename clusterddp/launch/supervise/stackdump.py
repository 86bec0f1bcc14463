"""Ask running workers for their stacks: signal them all at once, read what they appended.

Each worker's bootstrap appends a faulthandler dump to its own ``rank<R>.stacks`` file when
it receives ``protocol.DUMP_SIGNAL``; we remember each file's size, signal, and read what
was added once the file stops growing. A worker stuck in C code that holds the GIL cannot
answer in Python; it is reported as such (``stackreport``) instead of blocking the report.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from clusterddp.protocol import DUMP_SIGNAL


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
