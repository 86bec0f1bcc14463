"""A cgroup v2 of the job: nothing a worker starts can leave it, and one write kills it all.

Process groups, PDEATHSIG, the marker variable and the subreaper each miss some process (a
daemon that calls setsid, double-forks and execs with an empty environment escapes the first
three; the subreaper only sees it while the launcher lives). Cgroup membership is inherited on
fork and only a privileged process that writes to another cgroup's ``cgroup.procs`` can leave,
so where a cgroup can be created (cgroup2 mounted and writable here: root, or a delegated
subtree; Linux >= 5.14 for ``cgroup.kill``), each worker moves itself into the job's cgroup
between fork and exec, and teardown (or the reaper, when the launcher was killed) writes
``cgroup.kill`` and removes the directory. Where it cannot, ``create`` returns None and the
other mechanisms do the work alone. Nothing here is needed for correctness elsewhere.

``CLUSTERDDP_NO_CGROUP=1`` turns it off (a site whose cgroups belong to its scheduler).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

#: Set to 1 to never create a job cgroup.
DISABLE_ENV = "CLUSTERDDP_NO_CGROUP"
#: Name of every job cgroup: PREFIX + the launcher's marker token (pid-random).
PREFIX = "clusterddp-"


def _cgroup2_mount() -> tuple[str, str] | None:
    """(mount point, root inside the hierarchy) of the cgroup2 mount (unified or hybrid)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if " - cgroup2 " in line and len(fields) > 4:
                    return fields[4], fields[3]
    except OSError:
        pass
    return None


def _own_cgroup() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _parent_dir() -> str | None:
    """The directory of this process's own cgroup v2, where the job's cgroup goes."""
    mount, own = _cgroup2_mount(), _own_cgroup()
    if mount is None or own is None:
        return None
    point, root = mount
    if root != "/" and not (own == root or own.startswith(root.rstrip("/") + "/")):
        return None
    relative = own[len(root):] if root != "/" else own
    path = os.path.join(point, relative.lstrip("/"))
    return path if os.path.isdir(path) else None


def _remove_stale(parent: str) -> None:
    """Empty job cgroups whose launcher is gone (it and its reaper were both killed)."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            os.rmdir(os.path.join(parent, name))  # EBUSY while populated: left alone
        except OSError:
            pass


@dataclass
class JobCgroup:
    """One job's cgroup directory and an fd on its ``cgroup.procs`` for the workers to join."""

    path: str
    procs_fd: int

    @classmethod
    def create(cls, token: str) -> "JobCgroup | None":
        """A fresh cgroup for the job, or None where cgroup v2 is absent, read-only or old."""
        if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
            return None
        parent = _parent_dir()
        if parent is None:
            return None
        _remove_stale(parent)
        path = os.path.join(parent, PREFIX + token)
        try:
            os.mkdir(path)
        except OSError:
            return None
        try:
            if not os.path.exists(os.path.join(path, "cgroup.kill")):
                raise OSError("no cgroup.kill (Linux < 5.14)")
            fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            _rmdir(path)
            return None
        return cls(path, fd)

    def join_from_child(self) -> None:
        """Runs in a worker between fork and exec: move this process into the cgroup."""
        try:
            os.write(self.procs_fd, b"0")
        except OSError:
            pass  # not fatal: process groups, the marker and the subreaper still apply

    def kill(self) -> None:
        """SIGKILL every process in the cgroup, at once, however it got there."""
        kill(self.path)

    def empty(self) -> bool:
        return empty(self.path)

    def remove(self, deadline: float) -> bool:
        """Kill what is left, wait until empty (or ``deadline``), remove the directory."""
        try:
            os.close(self.procs_fd)
        except OSError:
            pass
        return remove(self.path, deadline)


def kill(path: str) -> None:
    """Write ``cgroup.kill`` of the cgroup at ``path`` (no error when it is gone)."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:
        pass


def empty(path: str) -> bool:
    """True when no live process is left in the cgroup (or it is gone); zombies do not count."""
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            return "populated 0" in f.read()
    except OSError:
        return True


def pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def remove(path: str, deadline: float) -> bool:
    """Kill, wait until empty or ``deadline``, rmdir; True when the directory is gone."""
    kill(path)
    while not empty(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return _rmdir(path)


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        for pid in pids(path):  # still populated past the deadline: try once more, by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return False
