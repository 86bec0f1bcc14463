"""The training stall of one checkpoint, side by side: torch.save, DCP sync, DCP async
(thread and process), and clusterddp.train's Checkpointer (async, async copying before it
returns, sync).

    .venv/bin/python benchmarks/checkpoint_stall.py [--nproc 2] [--mb 256] [--rounds 5]

Starts ``--nproc`` gloo processes on this machine (CPU). Each holds the same state of
``--mb`` MB: a stack of bias-free Linear layers (half the bytes) and SGD's momentum for them
(the other half), as replicated DDP state is, and trains it: forward, backward, SGD step and
a small all-reduce per step that keeps the ranks in step as DDP's does. Round after round
(the order of the methods rotating, so drift in the machine's load hits all alike) each
method runs ``--steps`` steps without saving, then saves once and runs ``--steps`` steps
again. Its **stall** is the time the training thread was blocked by the save: the call
itself (for the synchronous ones the whole write; for the async ones the staging: the copy
off the training tensors and the hand-off), plus, for clusterddp's deferred copy, the time
the next ``optimizer.step`` waited for that copy. **steps after, extra** is how much longer
the steps after the save took than the same steps just before it, the call excluded: what
the background write took from training (CPU, GIL). On a loaded shared machine this column
is mostly noise (it can be negative); on a quiet one it shows the writer's interference.
``save to done`` is the time until the write was complete. Rank 0 prints the medians, and
last the line ``async stall / synchronous save: R``: clusterddp's async stall over a
synchronous ``torch.save``'s (the issue's goal: R <= 0.10). Absolute times depend on the disk
and on the machine's load; compare ratios within one run.

Methods: ``torch.save``: rank 0 writes one file (temp file, fsync, rename), the others wait:
what clusterddp.train did before. ``dcp sync``: ``torch.distributed.checkpoint.save``, every
rank writes its share. ``dcp async thread`` / ``dcp async process``: ``dcp.async_save`` with
``AsyncCheckpointerType.THREAD`` / ``PROCESS`` (its own gloo group, as PyTorch advises, so its
collectives do not interleave with training's). ``clusterddp async``:
``clusterddp.train.Checkpointer`` (reused staging buffers; the big copy made by the writer
thread behind the next forward/backward; manifest with sizes and sha256); ``clusterddp
async eager copy``: the same with ``defer_copy=False`` (all copied before the call returns); ``clusterddp sync``: the same, waited for.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
METHODS = ("torch.save", "dcp sync", "dcp async thread", "dcp async process",
           "clusterddp async", "clusterddp async eager copy", "clusterddp sync")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--mb", type=int, default=256, help="state size: weights + momentum")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8, help="training steps timed after each save")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dir", default=None, help="where to write (default: a fresh temp dir)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    return p.parse_args()


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    from clusterddp.train import Checkpointer, TrainState, init_distributed
    from clusterddp.train.checkpoint import atomic_save

    ctx = init_distributed()
    rank = ctx.rank
    side = dist.new_group(backend="gloo")  # DCP async's own group
    width = 2048
    layers = max(1, round(args.mb * 2 ** 20 / 2 / (width * width * 4)))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-5, momentum=0.9)  # stays finite
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    state_mb = 2 * sum(p.numel() * 4 for p in model.parameters()) / 2 ** 20
    root = Path(args.out)
    chosen = [m for m in METHODS if m in args.methods.split(",")]
    clusterddp_async = Checkpointer(root / "cddp-async", ctx, mode="async", keep=1)
    clusterddp_eager = Checkpointer(root / "cddp-eager", ctx, mode="async", keep=1,
                                    defer_copy=False)
    clusterddp_sync = Checkpointer(root / "cddp-sync", ctx, mode="sync", keep=1)
    pending: dict[str, Any] = {}

    def dcp_state() -> dict[str, Any]:
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "optim": osd}

    def run(name: str, i: int) -> Callable[[], None] | None:
        """Start one save; return what waits for its background part (None: none)."""
        if name == "torch.save":
            if rank == 0:
                atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict()},
                            root / "torchsave" / "last.pt")
            return None
        if name == "dcp sync":
            dcp.save(dcp_state(), checkpoint_id=str(root / f"dcp-sync-{i % 2}"))
            return None
        if name.startswith("dcp async"):
            kind = AsyncCheckpointerType.THREAD if name.endswith("thread") else AsyncCheckpointerType.PROCESS
            future = dcp.async_save(dcp_state(), checkpoint_id=str(root / f"{name[-7:]}-{i % 2}"),
                                    process_group=side, async_checkpointer_type=kind)
            return lambda: future.result()
        checkpointer = {"clusterddp async": clusterddp_async, "clusterddp sync": clusterddp_sync,
                        "clusterddp async eager copy": clusterddp_eager}[name]
        checkpointer.save(model=model, optimizer=opt, state=TrainState(global_step=i))
        return None if checkpointer is clusterddp_sync else checkpointer.wait

    x = torch.randn(args.batch, width)
    flag = torch.zeros(1)

    def train_steps(n: int) -> None:
        """n training steps: forward, backward, SGD with momentum, and one small all-reduce
        that keeps the ranks in step as DDP's gradient all-reduce does (a rank that stalls
        stalls the others)."""
        for _ in range(n):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            dist.all_reduce(flag)

    stalls: dict[str, list[float]] = {m: [] for m in chosen}
    extra: dict[str, list[float]] = {m: [] for m in chosen}
    writes: dict[str, list[float]] = {m: [] for m in chosen}
    train_steps(2)  # warm
    for i in range(args.rounds):
        order = chosen[i % len(chosen):] + chosen[:i % len(chosen)]
        for name in order:
            dist.barrier()
            began = time.perf_counter()
            train_steps(args.steps)  # the same steps without a save, just before
            plain = time.perf_counter() - began
            dist.barrier()
            fenced = clusterddp_async.fence_wait_s
            began = time.perf_counter()
            finish = run(name, i)
            called = time.perf_counter() - began
            train_steps(args.steps)
            trained = time.perf_counter() - began
            fenced = clusterddp_async.fence_wait_s - fenced  # the next step's wait for the copy
            if finish is not None:
                finish()
            dist.barrier()
            done = time.perf_counter() - began
            # Rank 0's view; the ranks move together (the all-reduce per step).
            stalls[name].append(called + fenced)
            extra[name].append(trained - plain - called)
            writes[name].append(done)
    clusterddp_async.close()
    clusterddp_eager.close()
    clusterddp_sync.close()
    if rank == 0:
        base = statistics.median(stalls["torch.save"]) if "torch.save" in stalls else None
        print(f"{ctx.world_size} gloo ranks, {state_mb:.0f} MB of state ({layers} x Linear"
              f"({width}, {width}) + momentum), {args.rounds} rounds, {args.steps} steps of batch "
              f"{args.batch} after each save, writing to {root}")
        print(f"{'method':<30} {'stall s':>8} {'/ torch.save':>13} {'steps after, extra s':>21} "
              f"{'save to done s':>15}")
        for name in chosen:
            stall = statistics.median(stalls[name])
            ratio = f"{stall / base:.3f}" if base else "-"
            print(f"{name:<30} {stall:8.3f} {ratio:>13} {statistics.median(extra[name]):21.3f} "
                  f"{statistics.median(writes[name]):15.3f}")
        if base and "clusterddp async" in stalls:
            print(f"async stall / synchronous save: {statistics.median(stalls['clusterddp async']) / base:.3f}")
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    args = parse_args()
    if "RANK" in os.environ:
        worker(args)
        return 0
    out = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    try:
        for rank in range(args.nproc):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(args.nproc), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": str(REPO)}
            procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--out-internal",
                                           str(out)], env=env))
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if not args.dir:
            shutil.rmtree(out, ignore_errors=True)
    return max(codes, default=0)


if __name__ == "__main__":
    if "--out-internal" in sys.argv:
        at = sys.argv.index("--out-internal")
        out_dir = sys.argv[at + 1]
        del sys.argv[at:at + 2]
        parsed = parse_args()
        parsed.out = out_dir
        worker(parsed)
        sys.exit(0)
    sys.exit(main())
