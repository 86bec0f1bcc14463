"""Supervising the workers of this node: one fails, all stop; nothing left running.

- ``supervisor``: ``LocalSupervisor``, the loop through its named states, built whole
  - ``states``: those states (``State``) and the moves between them, checked
  - ``attempt``: one attempt started, watched until it ends, torn down (RUNNING, STOPPING)
  - ``requests``: what signals and threads ask of the loop (stop, end an attempt, stacks)
  - ``telling``: the report, the SSH head's result line, the attempt's end in the event log
- ``watch``: the SSH head's session seen from a remote launcher (``--watch-stdin``)
- ``waker``: a wake-up that signal handlers may call (a pipe, no lock)
- ``diagnostics``: hooks on the supervisor's tick: stacks on request, hangs, the slow host
- ``stackdump``: ask running workers for their stacks, read what they wrote
- ``runlock``: one launcher per rank log (and one SSH head per run id), held by ``flock``
"""
