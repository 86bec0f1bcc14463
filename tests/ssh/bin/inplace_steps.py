"""Worker: writes argv[1]/rank<RANK>.attempt<N>.json (pid, parent, master port, restart count,
/proc cmdline), then runs gloo all_reduce steps. In attempt 0 (argv[2] "kill-rank", default),
rank 1 SIGKILLs itself at step 5; with argv[2] "kill-launcher" rank 1 SIGKILLs its launcher
(its parent) at step 5 instead; with "mark-last" the last rank writes argv[1]/mark at step 5
and goes on (the test then kills its host), with "mark-first" rank 0. A later attempt does 3
steps and exits 0."""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from clusterddp.train import heartbeat

out, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "kill-rank")
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
with open("/proc/self/cmdline", "rb") as f:
    cmdline = [part.decode() for part in f.read().split(b"\0")[:-1]]
with open(os.path.join(out, f"rank{rank}.attempt{attempt}.json"), "w") as f:
    json.dump({"pid": os.getpid(), "ppid": os.getppid(), "port": os.environ["MASTER_PORT"],
               "restart": os.environ["TORCHELASTIC_RESTART_COUNT"], "cmdline": cmdline,
               "world": os.environ["WORLD_SIZE"], "group_rank": os.environ["GROUP_RANK"],
               "master": os.environ["MASTER_ADDR"]}, f)
dist.init_process_group("gloo")
for step in range(200 if attempt == 0 else 3):
    marks = {"mark-last": dist.get_world_size() - 1, "mark-first": 0}
    if attempt == 0 and rank == marks.get(mode, -1) and step == 5:
        with open(os.path.join(out, "mark"), "w") as f:
            f.write(repr(time.time()))
    elif attempt == 0 and mode not in marks and rank == 1 and step == 5:
        os.kill(os.getpid() if mode == "kill-rank" else os.getppid(), signal.SIGKILL)
    value = torch.ones(4)
    dist.all_reduce(value)
    heartbeat(step)
    time.sleep(0.05)
print(f"rank {rank} attempt {attempt} done", flush=True)
dist.destroy_process_group()
