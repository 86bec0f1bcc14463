"""Observing a run: what it writes and says, for people and for the launchers around it.

- ``logs``: each worker's output to its rank log, visible lines to the console
- ``merge``: identical console lines of several ranks shown as one
- ``report``: ``WorkerExit``, what happened to each worker, and the root-cause report
- ``runlog``: the run's event log, and what the ranks' progress records say
- ``peers``: without a head, node 0 reads the other nodes' progress records in the shared run
  directory
- ``record``: the launcher's own account of an attempt, for the sbatch script
"""
