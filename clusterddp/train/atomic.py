"""Write a file so that readers see the old content or the new, never a torn one.

Temp file beside the target, fsync, rename over it, fsync the directory. Checkpoints and
inference shards both need this; a crash or preemption mid-write must not leave a file a
resume or a merge would half-read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable

from clusterddp.atomicfile import fsync_dir


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write(f)`` on a temp file beside ``path`` and move it into place durably."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(target.parent)
    return target
