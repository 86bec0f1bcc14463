"""The default job: every rank joins the process group, all-reduces its rank, checks the sum.

Reads only the torchrun env contract (RANK, WORLD_SIZE, MASTER_ADDR, ...), so it runs the
same under clusterddp and torchrun.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> int:
    backend = os.environ.get("CLUSTERDDP_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    value = torch.tensor([float(rank)], device=device)
    dist.all_reduce(value)
    expected = world * (world - 1) / 2
    ok = value.item() == expected
    print(f"hello from rank {rank}/{world} (local rank {os.environ['LOCAL_RANK']}) on {socket.gethostname()}: "
          f"all_reduce sum {value.item():.0f} {'== ' if ok else '!= '}{expected:.0f}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
