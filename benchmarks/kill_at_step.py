"""Benchmark worker: a gloo DDP loop (all_reduce, 20 ms per step). In attempt 0 rank 1 writes
the wall time to argv[1]/killed and SIGKILLs itself at step argv[2] (20); in a later attempt
rank 0 writes the wall time of its first completed step to argv[1]/resumed, and all ranks
leave after that step (os._exit, as noop_gloo.py: interpreter teardown is not measured)."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

out, kill_at = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("gloo")
rank = dist.get_rank()
step = 0
while True:
    if attempt == 0 and rank == 1 and step == kill_at:
        with open(os.path.join(out, "killed"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    value = torch.ones(16)
    dist.all_reduce(value)
    if attempt > 0:
        if rank == 0:
            with open(os.path.join(out, "resumed"), "w") as f:
                f.write(repr(time.time()))
        sys.stdout.flush()
        os._exit(0)
    step += 1
    time.sleep(0.02)
