"""A tiny deterministic DDP training run that checkpoints on SIGUSR1 and exits 75.

Each step's data comes from (step, rank) alone, so a run interrupted and resumed from its
checkpoint must end with exactly the weights of an uninterrupted run. The flag set by the
signal is agreed on across ranks at the step boundary (all_reduce MAX), because the signal
reaches the ranks at different moments.

Gradients are averaged with one all_reduce per parameter rather than DDP: DDP re-orders its
gradient buckets after the first iteration of every process, so the first step after a resume
would sum in a different order than the uninterrupted run and differ in the last bit.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

PREEMPTED = 75
requested = False


def on_signal(signum: int, frame: object) -> None:
    global requested
    requested = True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGUSR1, on_signal)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ckpt_dir = Path(args.ckpt)
    ckpt = ckpt_dir / "checkpoint.pt"
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    world = dist.get_world_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank} on {socket.gethostname()}: resumed from step {start} "
              f"(SLURM_RESTART_COUNT={os.environ.get('SLURM_RESTART_COUNT', '0')})", flush=True)
    for step in range(start, args.steps):
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(16, 8, generator=generator)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
        if rank == 0:
            (ckpt_dir / "progress").write_text(str(step + 1))
        flag = torch.tensor([1.0 if requested else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            if rank == 0:
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, tmp)
                os.replace(tmp, ckpt)
                print(f"rank 0: preempted: checkpoint at step {step + 1}, exiting {PREEMPTED}", flush=True)
            dist.barrier()
            dist.destroy_process_group()
            return PREEMPTED
        time.sleep(args.step_sleep)
    if rank == 0:
        torch.save(model.state_dict(), args.out)
        print(f"rank 0: finished {args.steps} steps, loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
