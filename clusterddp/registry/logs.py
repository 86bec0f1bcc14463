"""``clusterddp logs RUN [-f] [--rank R]``: the files a run wrote, without the user finding them.

Each file's lines are printed whole with a label (``[rank 3] ``), control characters escaped
(a log holds whatever a worker wrote). ``-f`` prints what is there, then what is appended,
until the run is over (``alive`` says so) and the files are read to their end.
"""

from __future__ import annotations

import glob
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Callable

from clusterddp.errors import ClusterDDPError
from clusterddp.validate import clip, escape_controls, shown

#: Seconds between two looks at the files (and at ``alive``) while following.
POLL = 0.2
#: Bytes read from one file per look: a huge log is shown as it comes, memory stays small.
CHUNK = 1 << 20


@dataclass
class Source:
    label: str
    path: str
    offset: int = 0
    partial: bytes = field(default=b"")


def rank_logs(run_dir: str, rank: int | None = None) -> list[Source]:
    """``rank<R>.log`` of the run dir, by rank; one rank's with ``rank``."""
    found: list[tuple[int, str]] = []
    for path in glob.glob(os.path.join(glob.escape(run_dir), "rank*.log")):
        match = re.fullmatch(r"rank([0-9]{1,7})\.log", os.path.basename(path))
        if match:
            found.append((int(match.group(1)), path))
    found.sort()
    if rank is not None:
        found = [(r, p) for r, p in found if r == rank]
        if not found:
            raise ClusterDDPError(f"logs: no log of rank {rank} in {shown(run_dir, 200)}")
        return [Source("", found[0][1])]
    return [Source(f"[rank {r}] ", p) for r, p in found]


def _read(source: Source, out: IO[bytes], final: bool) -> bool:
    """Print the whole lines appended since the last look; True when there were any."""
    try:
        with open(source.path, "rb") as f:
            f.seek(source.offset)
            data = f.read(CHUNK)
    except OSError:
        return False
    if not data and not (final and source.partial):
        return False
    source.offset += len(data)
    data = source.partial + data
    lines = data.split(b"\n")
    source.partial = lines.pop()
    if final and source.partial:
        lines.append(source.partial)
        source.partial = b""
    label = source.label.encode()
    for line in lines:
        text = escape_controls(line.decode("utf-8", "replace"))
        out.write(label + text.encode("utf-8", "replace") + b"\n")
    return bool(lines)


def show(sources: list[Source], follow: bool, alive: Callable[[], bool],
         refresh: Callable[[], list[Source]] | None = None) -> int:
    """Print the sources (then follow them); 0, or an error when there is nothing to show."""
    out = sys.stdout.buffer
    if not sources and not follow:
        raise ClusterDDPError("logs: the run has no log files (yet)")
    while True:
        running = follow and alive()
        if refresh is not None:  # ranks whose logs appear later (a late start, a restart)
            known = {s.path for s in sources}
            sources.extend(s for s in refresh() if s.path not in known)
        for source in sources:
            while _read(source, out, final=not running):
                if len(source.partial) > CHUNK:  # one endless line: shown in pieces
                    out.write(source.label.encode() + source.partial + b"\n")
                    source.partial = b""
        out.flush()
        if not running:
            return 0
        time.sleep(POLL)


def one(path: str, label: str = "") -> list[Source]:
    if not os.path.isfile(path):
        raise ClusterDDPError(f"logs: {clip(path, 200)} does not exist (yet)")
    return [Source(label, path)]
