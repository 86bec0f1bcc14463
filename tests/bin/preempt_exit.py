"""Like a preempted trainer: on SIGTERM, or by itself after argv[1] seconds (rank 1 half a second
later), 'save a checkpoint' and exit 75. Writes argv[2]/rank<R>.ready once running."""
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
rank = int(os.environ["RANK"])
open(os.path.join(sys.argv[2], f"rank{rank}.ready"), "w").close()
time.sleep(float(sys.argv[1]) + 0.5 * rank)
sys.exit(75)
