"""The run registry: what this machine started, where, and how it went (docs/runs.md).

A unit of its own, below the commands (``launch``, ``schedulers`` and the CLI all record and
read runs) and above the leaves it builds on (``atomicfile``, ``redact``, ``procid``,
``events``, ``protocol``). Each module, by what you are after:

- ``store``: the records: one JSON file per run under ``$CLUSTERDDP_HOME/runs``, written whole,
  updated under a lock, never holding a secret; ids looked up (hostile ones refused)
- ``track``: a run records itself: ``begin`` when it starts, ``end`` with its exit code
- ``events``: what the run's own files say (attempts, root cause, restarting, hosts)
- ``view``: a record with what is true now (``lost``, ``restarting``), as ``ls`` and ``status`` show it
- ``local``: ``status``/``logs``/``stop`` of a run started here (local launcher, SSH head)
- ``logs``: print and follow a run's log files
- ``remote``: what a detached SSH run's head host runs for the typing machine: the head's start,
  its ranks counted, its rows, its commands (``launch.remotehead`` is the typing side)
"""
