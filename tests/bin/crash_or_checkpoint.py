"""Rank 1 crashes with exit 3 after half a second; the others treat SIGTERM as a preemption
(checkpoint, exit 75), as clusterddp.train does when SIGTERM is its preemption signal."""
import os
import signal
import sys
import time

if os.environ["RANK"] == "1":
    time.sleep(0.5)
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
time.sleep(600)
