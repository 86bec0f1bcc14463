"""Restarting: whether a failed attempt runs again, and how the nodes agree on it.

- ``policy``: ``RestartPolicy``, the local group's restarts with backoff; the exit code
- ``verdict``: will this failure repeat? judged from every rank's end
- ``judge``: an attempt's end weighed: its exit code, the verdict and the backoff together
- ``coordinate``: a node's launcher that outlives a failed attempt and waits for the decision
- ``stepcoord``: under SLURM, the launchers of one srun step decide together, node 0 deciding
"""
