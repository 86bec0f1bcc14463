"""Worker: joins the gloo group from torchrun's variables alone, all-reduces its rank, and writes
its contract variables and the sum to $OUT_DIR/rank<RANK>.json (uneven-hosts test)."""

import json
import os
import socket

import torch
import torch.distributed as dist

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
         "NODE_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank())])
dist.all_reduce(value)
record = {name: os.environ.get(name) for name in NAMES}
record.update(host=socket.gethostname(), sum=value.item(), world=dist.get_world_size(), rank=dist.get_rank())
with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json"), "w", encoding="utf-8") as f:
    json.dump(record, f)
dist.destroy_process_group()
