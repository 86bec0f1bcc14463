"""``clusterddp run`` and ``clusterddp doctor``: start a job's workers, supervise them, restart
them, and say what happened; on this node or, through ``ssh/``, on every host of a hostfile.

Where to look, by what you are after (each package's ``__init__`` maps its modules):

- ``run``: ``clusterddp run``: where a run goes (the fan-out or this node), detached or not, and
  its record in the run registry
- ``local``: ``run_local``, ``clusterddp run`` on one node: plan, check, supervise
- ``options``, ``flags``: the run's options records and the table of run flags (leaves)
- ``doctor``: ``clusterddp doctor``, a fan-out run with a built-in worker
- ``remotehead``: ``run --detach`` of a hostfile run: the SSH head started on the first host,
  and ``attach``/``logs``/``stop``/``ls`` of it from the typing machine
- ``start/``: from the job to running workers: plan, environment, bootstrap, warm start
- ``teardown/``: nothing outlives the launcher: process trees, cgroup, reaper
- ``supervise/``: the local supervisor's loop and what it watches: signals, stdin, hangs
- ``restart/``: whether and how an attempt is restarted: policy, verdict, in-place exchange
- ``observe/``: what the run says: rank logs, console, event log, exit report, records
- ``ssh/``: the SSH head: one launcher per host, relayed, restarted as a whole

A package imports only the ones below it, never up (tests/core/test_layers.py keeps it)::

    run
    local  doctor  remotehead
    ssh
    supervise
    restart
    start
    observe  teardown
    options  flags
"""
