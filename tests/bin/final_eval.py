"""A gloo loop of fast steps (clusterddp.train.step) and then, unannounced, what real scripts do
after training. key=value arguments: steps, compute (seconds per step), eval (seconds of the
final evaluation: compute and sleep, no collective, on every rank; then a barrier,
destroy_process_group and the exit), mode: "eval" (that), "stuck" (after the steps rank 1
sleeps forever outside any collective while rank 0 waits in all_reduce), "cross" (after the
steps every rank waits in an all_reduce that cannot complete: rank 0 on the default group,
rank 1 on another group of the same ranks)."""
import sys
import time

import torch
import torch.distributed as dist

from clusterddp.train import step

opts = {"steps": "30", "compute": "0.05", "eval": "8", "mode": "eval"}
opts.update(arg.split("=", 1) for arg in sys.argv[1:])


def evaluate(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    x = torch.ones(64, 64)
    while time.monotonic() < deadline:
        x = (x @ x).clamp(max=1.0)
        time.sleep(0.05)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    other = dist.new_group([0, 1])
    for n in range(1, int(opts["steps"]) + 1):
        with step(n) as s:
            with s.compute():
                time.sleep(float(opts["compute"]))
            dist.all_reduce(torch.ones(4))
    print(f"rank {rank} trained t={time.time():.2f}", flush=True)
    if opts["mode"] == "stuck":
        if rank == 1:
            while True:
                time.sleep(1)
        dist.all_reduce(torch.ones(1))
    if opts["mode"] == "cross":
        dist.all_reduce(torch.ones(1), group=other if rank == 1 else None)
    evaluate(float(opts["eval"]))
    dist.barrier()
    print(f"rank {rank} evaluated t={time.time():.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
