"""A gloo rank that reads one epoch through ``DataLoader(num_workers=2)`` and prints its CPUs.

torch checks ``num_workers`` against the rank's affinity mask when the loader starts its
processes: on a rank bound to one CPU it warns "This DataLoader will create 2 worker
processes in total. Our suggested max number of worker in current system is 1" (issue 37).
"""
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group(backend="gloo")
loader = DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4, num_workers=2)
total = torch.tensor([sum(float(batch.sum()) for (batch,) in loader)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} cpus {sorted(os.sched_getaffinity(0))} sum {total.item():g}", flush=True)
dist.destroy_process_group()
