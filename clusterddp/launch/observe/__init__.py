"""Observing a run: what it writes and says, for people and for the launchers around it.

- ``logs``: each worker's output to its rank log, visible lines to the console
- ``merge``: identical console lines of several ranks shown as one
- ``exits``: ``WorkerExit``, what happened to each worker, and the root-cause summary
- ``runlog``: the run's event log, and what the ranks' progress files say
- ``peers``: without a head, node 0 reads the other nodes' progress files in the shared run
  directory
- ``marks``: the launcher's marks for the sbatch script (``node<R>.started``, ``node<R>.exit``)
"""
