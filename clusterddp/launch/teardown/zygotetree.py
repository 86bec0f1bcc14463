"""What the teardown of the warm interpreter (``warm.Zygote``) reaches: its whole tree.

A preload runs in the zygote, and what it starts is the job's as much as a worker's
children are: a ``subprocess.Popen(start_new_session=True)`` leaves the zygote's process
group, a double fork leaves its tree, an ``execve`` with an empty environment carries no
marker (and the zygote has none: a teardown of an attempt kills marked processes, and the
zygote outlives attempts). So, as for the workers (guard.py), more than the group:

- where a cgroup v2 can be made (``cgroup.py``), the zygote starts in a cgroup of its own,
  beside the job's (the job's is emptied at each attempt's teardown, the zygote's only when
  the zygote goes): everything it starts stays there, and the reaper is told it, so a
  ``kill -9`` of the launcher empties it too;
- else, and besides, its tree: the zygote is a child subreaper while it imports
  (``zygote._imports_adopt``), so a preload's daemon stays its descendant; the tree is read
  from /proc before the zygote is told to go (once it exits, its children leave its tree)
  and SIGKILLed after, each process by its pid and start time.

A worker the zygote forks leaves its cgroup for the job's (``zygote._set_up``) and its tree
for the launcher's before it runs anything, so neither reaches a worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from clusterddp.launch.teardown import procs
from clusterddp.launch.teardown.cgroup import JobCgroup

#: Longest wait for the zygote's cgroup to empty after ``cgroup.kill``.
_CGROUP_WAIT = 2.0


@dataclass
class ZygoteTree:
    """The zygote's cgroup (None where none can be made) and, once it goes, its tree."""

    cgroup: JobCgroup | None

    @classmethod
    def open(cls) -> "ZygoteTree":
        """A cgroup for a zygote about to start (its name, as the job's, starts with the launcher's pid)."""
        return cls(JobCgroup.create(f"{procs.new_marker()}-zygote"))

    @property
    def cgroup_path(self) -> str | None:
        return self.cgroup.path if self.cgroup is not None else None

    def snapshot(self, pid: int) -> list[tuple[int, int]]:
        """The zygote's descendants now: call before it may exit."""
        return procs.descendants([pid])

    def kill(self, tree: list[tuple[int, int]]) -> None:
        """SIGKILL the cgroup and the ``snapshot``'s processes still the same ones; remove the
        cgroup (once empty). Idempotent."""
        if self.cgroup is not None:
            self.cgroup.kill()
        procs.kill_processes(tree)
        if self.cgroup is not None:
            self.cgroup.remove(time.monotonic() + _CGROUP_WAIT)
            self.cgroup = None
