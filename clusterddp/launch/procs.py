"""Process-level mechanics: start a worker that dies with us, and kill whole process trees.

Three layers make sure nothing outlives the launcher:
1. each worker is a session (and process group) leader, killed with ``os.killpg``;
2. ``PR_SET_PDEATHSIG`` kills a worker the instant the launcher dies, even by SIGKILL;
3. a forked *reaper* holds a pipe from the launcher and, when it reads EOF (the launcher is
   gone, however it died), SIGKILLs every worker process group it was told about: this takes
   the worker's own children (DataLoader workers, shell pipelines) that PDEATHSIG misses;
4. every worker carries ``CLUSTERDDP_SUPERVISOR_ID=<token>`` in its environment, which its
   descendants inherit: processes that left the group (``setsid`` daemons) are found by it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    import psutil

_PR_SET_PDEATHSIG = 1
#: Environment variable that marks every process of one launcher's workers.
MARKER = "CLUSTERDDP_SUPERVISOR_ID"

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux: no PDEATHSIG, the reaper still works
    _libc = None


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the child between fork and exec."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen[bytes]:
    """Start one worker in its own session, piped, killed by the kernel if we die."""
    parent = os.getpid()
    return subprocess.Popen(
        list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=lambda: _die_with_parent(parent), close_fds=True,
    )


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group is already empty."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def descendants(pid: int) -> list["psutil.Process"]:
    """All live descendants of ``pid`` (snapshot), including ones that left its group.

    psutil is imported here, not at module level: a job whose workers all finished never
    needs it, and every remote launcher of a large fan-out saves its import.
    """
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_processes(processes: Iterable["psutil.Process"]) -> None:
    import psutil

    for proc in processes:
        try:
            proc.kill()
        except psutil.Error:
            pass


def new_marker() -> str:
    """A token unique to this launcher, for ``MARKER``."""
    return f"{os.getpid()}-{os.urandom(6).hex()}"


def marked_pids(token: str) -> list[int]:
    """Live processes whose environment carries ``MARKER=token`` (read from /proc)."""
    needle = f"{MARKER}={token}".encode()
    found: list[int] = []
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_marked(token: str) -> None:
    for pid in marked_pids(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def group_alive(pgid: int) -> bool:
    return signal_group(pgid, 0)


def wait_groups_gone(pgids: Iterable[int], deadline: float) -> list[int]:
    """Wait until every group is empty or the deadline passes; return those still alive."""
    pending = list(pgids)
    while pending and time.monotonic() < deadline:
        pending = [g for g in pending if group_alive(g)]
        if pending:
            time.sleep(0.02)
    return [g for g in pending if group_alive(g)]


class Reaper:
    """A forked guard that SIGKILLs every registered process group when the launcher dies."""

    def __init__(self, token: str) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the reaper
            os.close(write_end)
            _reaper_main(read_end, token)
        os.close(read_end)
        self.pid = pid
        self._pipe = os.fdopen(write_end, "w", buffering=1)
        os.set_inheritable(write_end, False)

    def watch(self, pgid: int) -> None:
        """Tell the reaper about a worker's process group."""
        try:
            self._pipe.write(f"{pgid}\n")
        except (BrokenPipeError, ValueError):
            pass

    def close(self) -> None:
        """Normal end: the groups are already dead; let the reaper check once more and exit."""
        try:
            self._pipe.close()
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _reaper_main(read_end: int, token: str) -> None:
    """Body of the reaper process: read pgids until EOF, then kill them all. Never returns."""
    try:
        os.setsid()  # out of the terminal's process group: Ctrl-C is for the launcher
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # do not hold the launcher's console/pipes open after it exits
            os.dup2(devnull, fd)
        for fd in range(3, 1024):
            if fd != read_end:
                try:
                    os.close(fd)
                except OSError:
                    pass
        pgids: set[int] = set()
        buffer = b""
        while True:
            try:
                chunk = os.read(read_end, 4096)
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                break
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            pgids.update(int(line) for line in lines if line.strip())
        for pgid in pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        kill_marked(token)
    finally:
        os._exit(0)
