"""A gloo DDP loop that reports its steps with clusterddp.train.step(): each step "computes"
(sleeps compute= seconds inside s.compute()), then all_reduces. key=value arguments:
steps, compute, slow_rank/slow_from (that rank computes 2x from that step on, and says when),
ckpt_every/ckpt_x (rank 0 checkpoints for ckpt_x steps' compute every ckpt_every steps, the
others wait in a barrier; then every rank evaluates for 3 steps' compute), stuck_rank/stuck_at
(that rank sleeps forever in load_batch at that step). The end (destroy_process_group and the
interpreter's exit, which can take seconds on a busy machine) is announced as a phase, as work after
the last step must be."""
import sys
import time

import torch
import torch.distributed as dist

from clusterddp.train import phase, step

opts = {"steps": "40", "compute": "0.05", "slow_rank": "-1", "slow_from": "-1", "ckpt_every": "0", "ckpt_x": "30",
        "stuck_rank": "-1", "stuck_at": "-1"}
opts.update(arg.split("=", 1) for arg in sys.argv[1:])
o = {k: float(v) for k, v in opts.items()}


def load_batch(n: int, rank: int) -> torch.Tensor:
    if rank == o["stuck_rank"] and n == o["stuck_at"]:
        print(f"rank {rank} stuck at step {n} t={time.time():.2f}", flush=True)
        while True:
            time.sleep(1)
    return torch.ones(4)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for n in range(1, int(o["steps"]) + 1):
        batch = load_batch(n, rank)
        slow = rank == o["slow_rank"] and n >= o["slow_from"] >= 0
        if slow and n == o["slow_from"]:
            print(f"rank {rank} slow from step {n} t={time.time():.2f}", flush=True)
        with step(n) as s:
            with s.compute():
                time.sleep(o["compute"] * (2 if slow else 1))
            dist.all_reduce(batch)
        if o["ckpt_every"] and n % int(o["ckpt_every"]) == 0:
            if rank == 0:
                with phase("checkpoint"):
                    time.sleep(o["compute"] * o["ckpt_x"])
            dist.barrier()
            with phase("eval"):
                time.sleep(o["compute"] * 3)
                dist.all_reduce(torch.ones(1))
    print(f"rank {rank} done t={time.time():.2f}", flush=True)
    print("finished", flush=True)  # the same line from every rank: one console line
    # After the last step: for hang_timeout auto, not a stall. Left open to the process's end:
    # the interpreter's exit (torch's and gloo's teardown) took over 5 s on a loaded machine.
    phase("shutdown").__enter__()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
