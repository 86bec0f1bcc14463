"""Append "<TORCHELASTIC_RESTART_COUNT> <wall time>" to argv[1]/starts<RANK>, print one line,
then act on argv[2]: "fail" exits 3 on every attempt; "hang-once" sleeps silently on
attempt 0 (a hang once the line above is printed) and exits 0 on every later attempt."""
import os
import sys
import time

out, mode = sys.argv[1], sys.argv[2]
rank, attempt = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with open(os.path.join(out, f"starts{rank}"), "a") as f:
    f.write(f"{attempt} {time.time()}\n")
print(f"rank {rank} attempt {attempt}", flush=True)
if mode == "fail":
    sys.exit(3)
if mode == "hang-once" and attempt == 0:
    time.sleep(600)
