"""Join the gloo group the torchrun contract describes, all-reduce the rank, then write this worker's
environment, the sum and its hostname as JSON to argv[1]/rank<RANK>.json."""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
value = torch.tensor([float(dist.get_rank())])
dist.all_reduce(value)
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "sum": value.item(), "host": socket.gethostname()}, f)
dist.destroy_process_group()
