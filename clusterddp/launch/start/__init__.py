"""Starting workers: from the job and this node's topology to running processes.

- ``node``: ``NodePlan``, this node's place in the job and its workers, planned once
- ``plan``: the exact argv, env and files of each worker (``--dry-run`` prints it)
- ``workerenv``: ``WorkerEnv.build``, the one writer of a worker's environment
- ``rendezvous``: wait, bounded, for the master's name to resolve before any worker starts
- ``workers``: ``WorkerGroup``, N local workers: start, poll, tear down, close
- ``bootstrap``: the first code every worker runs (run by its path, or the zipapp's
  ``--clusterddp-bootstrap``)
- ``warm``: the launcher's side of the warm interpreter: start it, ask it for a worker
- ``zygote``: the warm interpreter itself, which imports torch once and forks workers (run by
  its path, or the zipapp's ``--clusterddp-zygote``)

``bootstrap.py`` and ``zygote.py`` run in the job's python, which may not import clusterddp:
run by their paths, they import nothing of it and load what they need by its path through
one loader, ``bootstrap.load`` (the zygote runs ``bootstrap.py`` itself as Python runs a
file); only inside the zipapp do they import it from the archive.
"""
