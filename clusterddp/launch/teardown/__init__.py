"""Tearing down: nothing a worker starts outlives the launcher, ``kill -9`` included.

- ``procs``: start a process that dies with us; kill whole process trees
- ``cgroup``: the job's cgroup v2, which nothing can leave and one write kills
- ``reaper``: a forked guard that kills the job when the launcher dies
- ``forking``: fork a child with a pipe to it (the reaper, the zygote's intermediates)
- ``guard``: ``JobGuard``, what a worker group's teardown reaches beyond its process groups
- ``zygotetree``: what the warm interpreter's teardown reaches
"""
