"""DataLoader workers of a bound rank vs an unbound one, side by side in one run.

    .venv/bin/python benchmarks/loader_affinity.py [--nproc 2] [--rounds 6] [--epochs 3]

Why: on a machine with as many CPUs as workers, the disjoint shares that ``cpu_affinity``
gave (before issue 37) are one CPU per rank, so a rank's ``DataLoader(num_workers=2)`` runs
its two loader processes and the training process on that one CPU (and torch warns "Our
suggested max number of worker in current system is 1"). Unbound (torchrun's default), the
same processes may run on any CPU of the node. This measures what that costs.

Each round starts the same ``--nproc``-rank gloo job twice, back to back, order alternating
between rounds: "bound" with each rank pinned exactly as the launcher pins it (the disjoint
share ``clusterddp.affinity.plan_binding`` computes for ``exclusive``, which ``auto`` gave
on this machine before issue 37; ``os.sched_setaffinity`` between fork and exec, as
``procs.spawn`` does, and ``OMP_NUM_THREADS`` = the share's size), and "unbound" with the
launcher's whole mask (``OMP_NUM_THREADS`` = cores / ranks, as the launcher sets it). A rank
trains an MLP under DDP from a ``DataLoader(num_workers=2)`` whose samples cost CPU (crop,
flip, blur, normalize, as a vision pipeline does), one warm-up epoch then ``--epochs`` timed
epochs (the loader's processes start anew each epoch, torch's default). Rank 0 reports its
median ms/step; the figure is the median of the per-round ratios bound / unbound (each pair
ran back to back, so load from other processes on a shared machine hits both alike). Also
printed: whether torch's "suggested max number of worker" warning appeared, per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WARNING = "Our suggested max number of worker in current system is"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per job (after one warm-up)")
    p.add_argument("--steps", type=int, default=12, help="steps per epoch")
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--loader-workers", type=int, default=2, help="DataLoader num_workers per rank")
    return p.parse_args()


class Images:
    """Synthetic 3x72x72 uint8 images whose loading costs CPU, as decode + augment does."""

    def __init__(self, count: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (count, 3, 72, 72), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (count,), generator=g)
        self.kernel = torch.full((3, 1, 3, 3), 1 / 9)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        import torch
        import torch.nn.functional as F

        x = self.images[index].float() / 255
        top, left = index % 8, (index * 7) % 8
        x = x[:, top:top + 64, left:left + 64]
        if index % 2:
            x = x.flip(-1)
        for _ in range(6):  # a few passes of blur: the CPU cost of a real decode + augment
            x = F.conv2d(x.unsqueeze(0), self.kernel, padding=1, groups=3).squeeze(0)
        x = (x - x.mean()) / (x.std() + 1e-6)
        return x.flatten(), self.labels[index]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data: Any = Images(args.steps * args.batch * world)  # a map-style dataset, duck-typed
    sampler: DistributedSampler[Any] = DistributedSampler(data, num_replicas=world, rank=rank)
    loader: DataLoader[Any] = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.loader_workers,
                        drop_last=True)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3 * 64 * 64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    per_step: list[float] = []
    for epoch in range(args.epochs + 1):
        sampler.set_epoch(epoch)
        start, steps = time.perf_counter(), 0
        for images, labels in loader:
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        if epoch:  # epoch 0 warms up
            per_step.append((time.perf_counter() - start) / steps)
    if rank == 0:
        print("RESULT " + json.dumps({"ms_per_step": statistics.median(per_step) * 1e3,
                                      "cpus": sorted(os.sched_getaffinity(0))}), flush=True)
    dist.destroy_process_group()


def bound_shares(nproc: int) -> list[tuple[int, ...] | None]:
    """The shares the launcher binds its ranks to: ``exclusive``'s disjoint split of our mask."""
    from clusterddp.affinity import plan_binding, read_topology

    return list(plan_binding("exclusive", nproc, read_topology()).cpus)


def run_job(args: argparse.Namespace, shares: list[tuple[int, ...] | None]) -> tuple[float, bool]:
    """One job of ``nproc`` ranks, each pinned to its share (None: unbound): rank 0's ms/step,
    and whether any rank printed torch's warning."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    default_threads = max(1, len(os.sched_getaffinity(0)) // args.nproc)
    procs = []
    for rank, cpus in enumerate(shares):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.nproc),
                   LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=str(default_threads if cpus is None else len(cpus)),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))

        def pin(cpus: tuple[int, ...] | None = cpus) -> None:
            if cpus:  # as clusterddp.launch.teardown.procs binds a worker: before exec
                os.sched_setaffinity(0, cpus)

        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env=env, preexec_fn=pin,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate() for p in procs]
    if any(p.returncode for p in procs):
        for out, err in outputs:
            sys.stderr.write(out + err)
        raise SystemExit("a rank failed")
    result = next(json.loads(line[7:]) for line in outputs[0][0].splitlines() if line.startswith("RESULT "))
    return float(result["ms_per_step"]), any(WARNING in err for _, err in outputs)


def main(args: argparse.Namespace) -> int:
    shares = bound_shares(args.nproc)
    from clusterddp.affinity import format_cpulist

    mask = format_cpulist(os.sched_getaffinity(0))
    shown = ", ".join(f"rank {r}: {'not bound' if c is None else format_cpulist(c)}" for r, c in enumerate(shares))
    print(f"{args.nproc} gloo ranks on CPUs {mask}, DataLoader(num_workers={args.loader_workers}) each, "
          f"batch {args.batch}/rank, {args.steps} steps x {args.epochs} timed epochs per job, "
          f"{args.rounds} rounds; bound = {shown}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    variants: dict[str, list[tuple[int, ...] | None]] = {"bound": shares, "unbound": [None] * args.nproc}
    times: dict[str, list[float]] = {"bound": [], "unbound": []}
    warned: dict[str, bool] = {"bound": False, "unbound": False}
    for r in range(args.rounds):
        order = ("bound", "unbound") if r % 2 == 0 else ("unbound", "bound")
        for name in order:
            ms, warn = run_job(args, variants[name])
            times[name].append(ms)
            warned[name] |= warn
        print(f"round {r + 1}: bound {times['bound'][-1]:7.2f} ms/step, unbound {times['unbound'][-1]:7.2f} "
              f"ms/step, ratio {times['bound'][-1] / times['unbound'][-1]:.3f}", flush=True)
    ratio = statistics.median(b / u for b, u in zip(times["bound"], times["unbound"]))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    for name in ("bound", "unbound"):
        print(f"{name:>7}: median {statistics.median(times[name]):7.2f} ms/step, best {min(times[name]):7.2f}; "
              f"torch's 'suggested max number of worker' warning: {'yes' if warned[name] else 'no'}")
    print(f"bound / unbound: {ratio:.3f} (median of per-round ratios), "
          f"{min(times['bound']) / min(times['unbound']):.3f} (best of each)")
    return 0


if __name__ == "__main__":
    arguments = parse_args()
    if "RANK" in os.environ:
        worker(arguments)
    else:
        sys.exit(main(arguments))
