"""A gloo DDP loop for restarts in place: every rank writes OUT/rank<R>.attempt<A> (its
TORCHELASTIC_RESTART_COUNT and its parent, the launcher); in attempt 0 rank KILL_RANK (1)
writes OUT/killed and SIGKILLs itself at step 20; a later attempt writes OUT/resumed after its
first step and ends after 5 steps. With LINGER (1) the other rank of attempt 0 ignores SIGTERM
and sleeps once its collective failed: its launcher's teardown then takes the grace period, and
the other node's launcher waits for the decision meanwhile.

    kill_then_finish.py OUT [KILL_RANK [LINGER]]
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
kill_rank = int(sys.argv[2]) if len(sys.argv) > 2 else 1
linger = len(sys.argv) > 3 and sys.argv[3] == "1"
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
with open(os.path.join(out, f"rank{rank}.attempt{attempt}"), "w") as f:
    f.write(f"{os.environ['TORCHELASTIC_RESTART_COUNT']} {os.getppid()}\n")
if attempt == 0 and linger and rank != kill_rank:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for step in range(25 if attempt == 0 else 5):
    if attempt == 0 and rank == kill_rank and step == 20:
        with open(os.path.join(out, "killed"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    value = torch.ones(4)
    try:
        dist.all_reduce(value)
    except RuntimeError:
        if not (attempt == 0 and linger):
            raise
        time.sleep(60)
    if attempt > 0 and step == 0 and rank == 0:
        with open(os.path.join(out, "resumed"), "w") as f:
            f.write(repr(time.time()))
    time.sleep(0.02)
dist.destroy_process_group()
print(f"rank {rank} attempt {attempt} done", flush=True)
