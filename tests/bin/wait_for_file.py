"""Print a line, write argv[1]/rank<R>.ready, wait until the file argv[2] exists (60 s at most),
print another line and exit 0 (1 when it never came)."""
import os
import sys
import time

rank = os.environ["RANK"]
print(f"rank {rank} started", flush=True)
open(os.path.join(sys.argv[1], f"rank{rank}.ready"), "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
sys.exit(0 if os.path.exists(sys.argv[2]) else 1)
