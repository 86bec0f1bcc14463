"""Write rank<RANK>.attempt<N>.json (pid, ppid, cmdline) to argv[1], then: in attempt 0, rank 1
waits for argv[1]/go and then kills itself with SIGKILL; every other worker waits for
argv[1]/end (when argv[2] is "wait") or exits 0."""
import json
import os
import signal
import sys
import time

import torch  # noqa: F401 (the entry imports torch: warm_start auto forks it)

out, attempt, rank = sys.argv[1], os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
with open(f"/proc/self/cmdline", "rb") as f:
    cmdline = f.read().split(b"\0")[:-1]
with open(os.path.join(out, f"rank{rank}.attempt{attempt}.json"), "w") as f:
    json.dump({"pid": os.getpid(), "ppid": os.getppid(), "cmdline": [c.decode() for c in cmdline]}, f)
if attempt == "0" and rank == "1":
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)
if len(sys.argv) > 2 and sys.argv[2] == "wait":
    while not os.path.exists(os.path.join(out, "end")):
        time.sleep(0.02)
