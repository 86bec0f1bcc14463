"""One launcher per rank log: each rank's lock in the run directory, held for the launcher's life
(and one SSH head per run id).

Two launchers given the same run id and ``logs.dir`` would write the same ``rank<N>.log``: the
second truncates the first's log while it is written, and both jobs "succeed". The run
directory itself is shared on purpose (the nodes of one job on one filesystem, several nodes on
one host, the SSH head's ``ssh-<host>.log``, restart attempts that append), so the lock is per
rank: ``<run-dir>/.rank<N>.lock``, one ``flock`` each. Two launchers of one job hold disjoint
ranks and never meet; two jobs that would share a rank are refused before any log is touched.
The SSH head locks ``.head.lock`` beside them, before it connects to any host.

``flock`` because the kernel releases it when the launcher ends, however it ends (``kill -9``
too): no stale lock to clean up, and a later launcher with the same run id (a restart of the
whole job, a new srun step) starts as before. The descriptors are close-on-exec and the forked
reaper closes them, so no worker or reaper keeps a lock after its launcher.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from clusterddp.errors import LaunchError
from clusterddp.protocol import HEAD_LOCK, rank_lock_name
from clusterddp.validate import escape_controls, shown

#: Bytes of a lock file read to name its holder.
_HOLDER_BYTES = 200
#: How often a restart attempt looks again for a lock an earlier attempt still holds.
_POLL = 0.1


@dataclass
class RankLocks:
    """The lock files this launcher holds open (and locked) until ``release``."""

    fds: list[int] = field(default_factory=list)

    def release(self) -> None:
        """Unlock by closing (also what the kernel does when the launcher dies)."""
        fds, self.fds = self.fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def lock_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, rank_lock_name(rank))


def lock_ranks(run_dir: str, ranks: Sequence[int], where: str, run_id: str, wait: float = 0.0,
               say: Callable[[str], None] | None = None) -> RankLocks:
    """Lock every rank of this node in ``run_dir`` (created if needed), or raise LaunchError
    naming the rank and the launcher that holds it.

    ``wait`` (seconds): a restart attempt started from outside (the SSH head, the batch script)
    may find a lock still held by the previous attempt's launcher on this host, which is still
    stopping (its SSH session was lost, its grace period runs): it waits that long for it.
    """
    files = [(lock_path(run_dir, rank), f"rank {rank}'s log") for rank in ranks]
    return _lock_all(run_dir, files, where, run_id, wait, say)


def lock_head(run_dir: str, where: str, run_id: str) -> RankLocks:
    """The SSH head's own files (``ssh-<host>.log``, ``launcher.json``): one head per run id."""
    return _lock_all(run_dir, [(os.path.join(run_dir, HEAD_LOCK), "the SSH head's files")], where, run_id, 0.0, None)


def _lock_all(run_dir: str, files: Sequence[tuple[str, str]], where: str, run_id: str, wait: float,
              say: Callable[[str], None] | None) -> RankLocks:
    locks = RankLocks()
    try:
        os.makedirs(run_dir, exist_ok=True)
        deadline = time.monotonic() + wait
        for path, what in files:
            locks.fds.append(_lock_one(path, what, where, run_id, deadline, say))
    except OSError as exc:
        locks.release()
        raise LaunchError(f"{where}: cannot lock the logs of run {shown(run_id)} in {shown(run_dir, 200)}: "
                          f"{exc.strerror or exc}") from None
    except BaseException:
        locks.release()
        raise
    return locks


def _lock_one(path: str, what: str, where: str, run_id: str, deadline: float,
              say: Callable[[str], None] | None) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                if time.monotonic() >= deadline:
                    raise LaunchError(
                        f"{where}: run {shown(run_id)}: another launcher ({holder}) holds {what}; "
                        "two jobs must not share a run id",
                        "give this job another --run-id, or wait until that launcher ends") from None
                if say is not None and not told:
                    told = True
                    say(f"clusterddp: note: another launcher ({holder}) still holds {what} of run {shown(run_id)} "
                        f"(the previous attempt stopping?); waiting up to {deadline - time.monotonic():.0f}s")
                time.sleep(_POLL)
        _mark_holder(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mark_holder(fd: int) -> None:
    """Write who holds the lock, for the message of a launcher refused later (best effort)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except OSError:
        pass


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return escape_controls(text[:80]) if text else "a launcher that has not named itself yet"
