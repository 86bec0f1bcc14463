"""Join the gloo group the torchrun contract describes, all-reduce the rank, then write this worker's
environment, the sum, its hostname, where ``import clusterddp`` comes from (None: nowhere) and its
/proc/self/cmdline (a warm worker's is the zygote's) as JSON to argv[1]/rank<RANK>.json."""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
value = torch.tensor([float(dist.get_rank())])
dist.all_reduce(value)
try:
    import clusterddp
    origin = clusterddp.__file__
except ImportError:
    origin = None
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    with open("/proc/self/cmdline", "rb") as cmdline:
        argv = [word.decode() for word in cmdline.read().split(b"\0")[:-1]]
    json.dump({"env": dict(os.environ), "sum": value.item(), "host": socket.gethostname(), "clusterddp": origin,
               "cmdline": argv}, f)
dist.destroy_process_group()
