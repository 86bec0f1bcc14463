"""A DDP loop: each step prints, then all_reduces. Rank argv[1] (default none) sleeps forever in
'load_batch' at step 3, so the others wait in all_reduce: the shape of a real data-loading hang."""
import sys
import time

import torch
import torch.distributed as dist


def load_batch(step: int, stuck: bool) -> torch.Tensor:
    if stuck and step == 3:
        while True:
            time.sleep(1)
    return torch.ones(4)


def main() -> None:
    stuck_rank = int(sys.argv[1]) if len(sys.argv) > 1 else -1
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10**9
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(steps):
        batch = load_batch(step, rank == stuck_rank)
        dist.all_reduce(batch)
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
