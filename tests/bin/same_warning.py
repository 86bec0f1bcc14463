"""Every rank prints the same warning and the same epoch lines, and a line of its own per step."""
import os
import sys
import time
import warnings

rank = int(os.environ["RANK"])
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
warnings.warn("the same for every rank")
for step in range(steps):
    print(f"rank {rank} loss {rank + step}", flush=True)
    print(f"epoch {step} done", flush=True)
    time.sleep(0.3)
