"""Join a gloo group and all_reduce once, then write argv[1]/rank<RANK>.attempt<N>.json (pid,
ppid, /proc/self/cmdline, where clusterddp comes from, the sum); rank 1 then exits 7 on
attempt 0 only (one restart), every other worker exits 0."""
import json
import os
import sys

import torch
import torch.distributed as dist

import clusterddp

out, attempt, rank = sys.argv[1], os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
dist.destroy_process_group()
with open("/proc/self/cmdline", "rb") as f:
    cmdline = [c.decode() for c in f.read().split(b"\0")[:-1]]
with open(os.path.join(out, f"rank{rank}.attempt{attempt}.json"), "w") as f:
    json.dump({"pid": os.getpid(), "ppid": os.getppid(), "cmdline": cmdline, "clusterddp": clusterddp.__file__,
               "sum": total.item()}, f)
if attempt == "0" and rank == "1":
    sys.exit(7)
