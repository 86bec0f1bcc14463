"""clusterddp: one job file, run here, over SSH, on SLURM or on OpenPAI.

The launcher (everything outside ``clusterddp.train``) never imports torch, so it
starts fast and runs on login nodes without a GPU stack.
"""

__version__ = "0.1.0"
