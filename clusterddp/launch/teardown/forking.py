"""Fork a child joined to this process by one pipe: the reaper (told what to kill) and the
zygote's intermediates (which report their workers' pids) are started this way.

Standard library only: the zygote, run by its path under the job's python, loads this file
by its path too (``bootstrap.load``).
"""

from __future__ import annotations

import os


def fork_with_pipe(child_writes: bool) -> tuple[int, int]:
    """Fork with a pipe between parent and child: ``(child's pid, this end)`` in the parent,
    ``(0, the child's end)`` in the child. ``child_writes``: the child writes and the parent
    reads (else the other way round). Each side closes the other's end at once, so the reader
    sees EOF when the writer is gone; a failed fork closes both ends and raises its OSError."""
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    child_end, parent_end = (write_end, read_end) if child_writes else (read_end, write_end)
    if pid == 0:
        os.close(parent_end)
        return 0, child_end
    os.close(child_end)
    return pid, parent_end
