"""clusterddp: one job file, run here, over SSH, on SLURM or on OpenPAI.

The launcher (everything outside ``clusterddp.train``) never imports torch, so it
starts fast and runs on login nodes without a GPU stack.
"""

# First, before anything can install a signal handler: the dispositions this process
# inherited, which its workers inherit in turn (sigstart.py).
from clusterddp import sigstart as _sigstart  # noqa: E402,F401

__version__ = "0.1.0"
