"""Benchmark worker: rank 1 records the wall time and exits 3 after argv[1] seconds; the
others wait (as ranks blocked in a collective would) until the launcher stops them."""
import os
import sys
import time

if os.environ["RANK"] == "1":
    time.sleep(float(sys.argv[1]))
    with open(sys.argv[2], "w") as f:
        f.write(repr(time.time()))
    sys.exit(3)
time.sleep(600)
