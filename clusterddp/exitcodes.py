"""Exit codes with a meaning beyond success/failure, shared by the launcher and the helpers.

Kept free of imports so the launcher can read them without torch.
"""

#: A worker saved a checkpoint after a preemption signal and asks to be requeued (EX_TEMPFAIL).
PREEMPTED = 75

#: A worker stopped because the loss became NaN/inf on some rank (EX_DATAERR): restarting the
#: same job from the same state would fail the same way, so the launcher does not restart it.
NONFINITE_LOSS = 65

#: The launcher tore the job down because no rank made progress for ``hang_timeout`` seconds.
HANG = 124

#: Bad input: a broken job file, an unknown key, unreachable host found by preflight.
USAGE = 2

#: Exits a restart cannot fix: preempted (the scheduler requeues), non-finite loss (same state,
#: same NaN). Neither the supervisor, the SSH head nor the sbatch script restarts them.
NOT_RESTARTED = (PREEMPTED, NONFINITE_LOSS)

#: Longest pause before a restart (1 s, 2 s, 4 s, ... up to this): of a node's group, of the
#: whole job, and of the srun step in the sbatch script.
MAX_BACKOFF = 30.0
