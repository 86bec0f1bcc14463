"""Exit codes of training workers that the launcher and schedulers act on.

The numbers live in ``clusterddp.exitcodes`` (torch-free, shared with the launcher); these
are the names training scripts use.
"""

from clusterddp.exitcodes import NONFINITE_LOSS, PREEMPTED

#: The worker stopped on a preemption signal after writing a checkpoint and wants to be run
#: again from it. 75 is ``EX_TEMPFAIL`` from sysexits.h: "temporary failure, try again".
#: A SLURM requeue wrapper can test ``$? -eq 75`` and ``scontrol requeue``.
PREEMPTED_EXIT_CODE = PREEMPTED

#: Training stopped because the loss became NaN or infinite on at least one rank. 65 is
#: ``EX_DATAERR``: restarting from the same state would fail the same way, so a launcher
#: should not spend restarts on it.
NONFINITE_LOSS_EXIT_CODE = NONFINITE_LOSS
