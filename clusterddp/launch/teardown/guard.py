"""What a teardown must reach beyond the workers' process groups, held for a worker group.

A worker's tree can leave its process group (``setsid`` children, double forks that clear
their environment), so the group is not enough. The layers kept here reach the rest: the
job's cgroup (when cgroup v2 lets us create one), the launcher's marker in every exec'd
descendant's environment, the launcher as child subreaper (orphans are reparented to it and
adopted here), and the reaper, a forked guard that kills all of it when the launcher dies,
``kill -9`` included. ``WorkerGroup`` decides when; this module knows how.
"""

from __future__ import annotations

import time
from typing import Iterable

from clusterddp.errors import LaunchError
from clusterddp.launch.teardown import procs
from clusterddp.launch.teardown.cgroup import JobCgroup
from clusterddp.launch.teardown.reaper import Reaper, ReaperLoss


class Orphans:
    """Orphans of the workers reparented to the launcher (it is their subreaper)."""

    def __init__(self, reaper: Reaper, before: set[int]) -> None:
        self.reaper = reaper
        #: Children of the launcher that are neither workers nor the reaper: those it had before.
        self.not_adopted = before
        self.adopted: set[int] = set()

    def adopt(self, worker_pids: Iterable[int]) -> None:
        """Tell the reaper of new orphans (so they die with a launcher killed by SIGKILL too),
        and collect the ones that exited (by pid, never waitpid(-1))."""
        known = self.not_adopted | {self.reaper.pid} | set(worker_pids)  # the reaper's pid now
        found = procs.children() - known
        for pid in found - self.adopted:
            self.reaper.watch_pid(pid)
        self.adopted |= found
        self.adopted -= procs.reap(self.adopted)

    def kill(self) -> None:
        procs.kill_pids(self.adopted)

    def keep(self, pid: int, cgroup: str | None = None) -> None:
        """A child of the launcher that is no orphan (the zygote): left alone, but it dies
        with a launcher killed by SIGKILL, and so does its ``cgroup`` (what it started)."""
        self.not_adopted.add(pid)
        self.reaper.watch(pid)
        if cgroup is not None:
            self.reaper.watch_cgroup(cgroup)


class JobGuard:
    """The job's cgroup, its reaper, its marker and the adopted orphans of one worker group."""

    def __init__(self, marker: str, cgroup: JobCgroup | None, reaper: Reaper, orphans: Orphans) -> None:
        self.marker = marker
        self.cgroup = cgroup
        self.reaper = reaper
        self.orphans = orphans

    @classmethod
    def open(cls, marker: str) -> "JobGuard":
        """Become the subreaper of the workers' trees; create the job's cgroup and the reaper
        (LaunchError when the reaper cannot be forked: no job without its guard)."""
        procs.become_subreaper()
        before = procs.children()
        cgroup = JobCgroup.create(marker)
        try:
            reaper = Reaper(marker, cgroup.path if cgroup else None)
        except OSError as exc:  # fork failed (EAGAIN, ENOMEM)
            if cgroup is not None:
                cgroup.remove(time.monotonic() + 1.0)
            raise LaunchError(f"cannot start the reaper process that guards the job: {exc.strerror or exc}") from None
        return cls(marker, cgroup, reaper, Orphans(reaper, before))

    def check_reaper(self) -> ReaperLoss | None:
        """A lost reaper replaced (or why it could not be); None while it runs."""
        return self.reaper.check()

    def adopt(self, worker_pids: Iterable[int]) -> None:
        self.orphans.adopt(worker_pids)

    def kill(self, trees: list[tuple[int, int]], worker_pids: Iterable[int]) -> None:
        """SIGKILL the job's cgroup, then what left the workers' groups: setsid children
        (``trees``), marked processes, and orphans reparented to us (double forks that
        cleared their environment)."""
        if self.cgroup is not None:
            self.cgroup.kill()
        procs.kill_processes(trees)
        procs.kill_marked(self.marker)
        self.orphans.adopt(worker_pids)
        self.orphans.kill()

    def gone(self) -> bool:
        """No adopted orphan left and the cgroup holds no live process."""
        return not self.orphans.adopted and (self.cgroup is None or self.cgroup.empty())

    def remove_cgroup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove(time.monotonic() + 1.0)

    def close_reaper(self) -> None:
        """The all-clear to the reaper (after the last teardown)."""
        self.reaper.close()
