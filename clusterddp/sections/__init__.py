"""Job-file sections that belong to one way of running a job (ssh, slurm, openpai).

Each section is a frozen dataclass in its own module, owned by the code that uses it;
``clusterddp.spec`` only plugs them into ``JobSpec``.
"""
