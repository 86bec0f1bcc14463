"""Supervising the workers of this node: one fails, all stop; nothing left running.

- ``supervisor``: ``LocalSupervisor``, the loop: attempts, signals, the end of the run
- ``watch``: the SSH head's session seen from a remote launcher (``--watch-stdin``)
- ``waker``: a wake-up that signal handlers may call (a pipe, no lock)
- ``diagnostics``: hooks on the supervisor's tick: stacks on request, hangs, the slow host
- ``stackdump``: ask running workers for their stacks, read what they wrote
- ``runlock``: one launcher per rank log (and one SSH head per run id), held by ``flock``
"""
