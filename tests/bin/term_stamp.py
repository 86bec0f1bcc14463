"""Every rank records the wall time of each SIGTERM in argv[1]/term<R> and keeps running
(it ignores SIGTERM); rank 1 exits 3 after argv[2] seconds."""
import os
import signal
import sys
import time

out, delay = sys.argv[1], float(sys.argv[2])
rank = os.environ["RANK"]


def stamp(_signum, _frame):
    with open(os.path.join(out, f"term{rank}"), "a") as f:
        f.write(f"{time.time()}\n")


signal.signal(signal.SIGTERM, stamp)
if rank == "1":
    time.sleep(delay)
    sys.exit(3)
while True:
    time.sleep(1)
