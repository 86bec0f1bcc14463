"""Process-level mechanics: start a worker that dies with us, and kill whole process trees.

Each layer covers what the one before misses; together nothing outlives the launcher:
1. each worker is a session (and process group) leader, killed with ``os.killpg``: the worker
   and every child that stays in its group;
2. ``PR_SET_PDEATHSIG`` kills a worker the instant the launcher dies, even by SIGKILL;
3. at teardown, the worker's process tree (parent links in /proc): children that left the
   group (``setsid``) while their parent lives;
4. every worker carries ``protocol.SUPERVISOR_ID_ENV=<token>`` in its environment, which its
   descendants inherit: processes that left the group *and* the tree are found by it, unless
   they cleared their environment;
5. the launcher is a child subreaper (``PR_SET_CHILD_SUBREAPER``): an orphan (double fork)
   comes back to it instead of init, and is killed and reaped at teardown; the reaper is told
   its pid, so it dies with a launcher killed by SIGKILL too (once adopted: ~0.1 s);
6. the job's cgroup v2 (``cgroup.py``), where one can be created: everything, whatever it does;
7. a forked *reaper* (``reaper.py``) holds a pipe from the launcher and, when it reads EOF
   without the all-clear (the launcher is gone, however it died), SIGKILLs every worker
   process group and adopted orphan it was told about, the marked processes, and the job's
   cgroup; a reaper that dies or is stopped is replaced at once (it is the launcher's child).

Only specific pids are ever waited for, never ``waitpid(-1)``: that would steal the exit
statuses of subprocess.Popen's workers.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import IO, Callable, Iterable, Mapping, Sequence

from clusterddp.launch.teardown import cgroup as cgroups
from clusterddp import sigstart
from clusterddp.procid import ProcStat, proc_stat, start_time
from clusterddp.protocol import SUPERVISOR_ID_ENV

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux: no PDEATHSIG, the reaper still works
    _libc = None


def become_subreaper() -> bool:
    """Make orphaned descendants (double forks) reparent to this process, not to init."""
    if _libc is None:
        return False
    return bool(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _die_with_parent(parent_pid: int, join: Callable[[], None] | None,
                     cpus: tuple[int, ...] | None = None) -> None:
    """Runs in the child between fork and exec."""
    sigstart.restore()  # the signal dispositions the launcher inherited, as `python script.py` keeps them
    if join is not None:
        join()  # into the job's cgroup before anything of the worker runs
    if cpus:
        try:  # before exec, so every thread the interpreter and torch start inherits it
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass  # CPUs taken away since the plan (cpuset change): run unbound, never fail
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str,
          cgroup: "cgroups.JobCgroup | None" = None,
          cpus: tuple[int, ...] | None = None, pass_fds: tuple[int, ...] = (),
          output: "int | IO[bytes]" = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """Start one worker in its own session (and the job's cgroup), piped, killed by the
    kernel if we die. ``pass_fds`` and ``output`` (stdout and stderr): for the zygote
    (warm.py), which keeps its socket and writes to its own log."""
    parent = os.getpid()
    join = cgroup.join_from_child if cgroup is not None else None
    return subprocess.Popen(
        list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=output, stderr=output, start_new_session=True,
        preexec_fn=lambda: _die_with_parent(parent, join, cpus), close_fds=True, pass_fds=pass_fds,
    )


def children() -> set[int]:
    """Pids of this process's children (live or zombie): one small read of the main thread's
    ``children`` file, since workers are started from the main thread and the kernel hands
    orphans to the subreaper's first live thread, the main one; a scan of /proc/*/stat where
    the kernel lacks that file."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            return {int(pid) for pid in f.read().split()}
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return set()
    return {pid for pid, stat in _stats() if stat[1] == me}


def _stats() -> list[tuple[int, ProcStat]]:
    """(pid, (state, ppid, pgrp, start time)) of every process, from /proc/*/stat."""
    result: list[tuple[int, ProcStat]] = []
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return result
    for entry in entries:
        stat = proc_stat(int(entry))
        if stat is not None:
            result.append((int(entry), stat))
    return result


def reap(pids: Iterable[int]) -> set[int]:
    """Collect the exit status of these children if they exited; the pids no longer ours."""
    gone = set()
    for pid in pids:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                gone.add(pid)
        except ChildProcessError:
            gone.add(pid)
    return gone


def kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group is already empty."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def descendants(roots: Iterable[int]) -> list[tuple[int, int]]:
    """(pid, start time) of every live descendant of ``roots``, also ones that left their
    group, from one scan of /proc (no psutil: its import alone costs ~20 ms of teardown)."""
    todo = list(roots)
    if not todo:
        return []
    stats = _stats()
    kids: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for pid, (state, ppid, _pgrp, start) in stats:
        if state not in "ZX":
            kids.setdefault(ppid, []).append(pid)
            started[pid] = start
    found: list[tuple[int, int]] = []
    while todo:
        for child in kids.pop(todo.pop(), []):
            found.append((child, started[child]))
            todo.append(child)
    return found


def kill_processes(processes: Iterable[tuple[int, int]]) -> None:
    """SIGKILL each (pid, start time) that is still the same process (its pid not reused)."""
    for pid, start in processes:
        if start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def new_marker() -> str:
    """A token unique to this launcher, for ``SUPERVISOR_ID_ENV``."""
    return f"{os.getpid()}-{os.urandom(6).hex()}"


def marked_pids(token: str) -> list[int]:
    """Live processes whose environment carries ``SUPERVISOR_ID_ENV=token`` (read from /proc)."""
    needle = f"{SUPERVISOR_ID_ENV}={token}".encode()
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


def live_groups(pgids: Iterable[int]) -> set[int]:
    """The groups that still have a live member. Zombies do not count: a zombie is dead, and
    one whose parent never reaps it (a container's init) would otherwise hold us forever."""
    pending = {g for g in pgids if group_alive(g)}
    if not pending:
        return pending
    return {stat[2] for _pid, stat in _stats() if stat[2] in pending and stat[0] not in "ZX"}
