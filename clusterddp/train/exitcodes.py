"""Exit codes of training workers that the launcher and schedulers act on.

This module imports nothing (not even torch), so the launcher can read the numbers
without paying for a torch import; ``clusterddp.exitcodes`` keeps the same values for
the launcher side and a test checks that the two never drift apart.
"""

#: The worker stopped on a preemption signal after writing a checkpoint and wants to be run
#: again from it. 75 is ``EX_TEMPFAIL`` from sysexits.h: "temporary failure, try again".
#: A SLURM requeue wrapper can test ``$? -eq 75`` and ``scontrol requeue``.
PREEMPTED_EXIT_CODE = 75

#: Training stopped because the loss became NaN or infinite on at least one rank. 65 is
#: ``EX_DATAERR``: restarting from the same state would fail the same way, so a launcher
#: should not spend restarts on it.
NONFINITE_LOSS_EXIT_CODE = 65
