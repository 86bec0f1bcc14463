"""The doctor's worker: time all_reduce across all ranks, then ping-pong between node pairs.

Started by ``clusterddp doctor`` through the normal launcher (locally or on every host of
the fan-out) as ``-m clusterddp.train.bandwidth``, so it runs with the job's
interpreter, env, backend and network interface exactly as a training job would. Rank 0
prints one ``CLUSTERDDP_DOCTOR {json}`` line; ``netperf`` turns it into tables. This is the
only part of the doctor that imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist

from clusterddp.netperf import pair_rounds
from clusterddp.protocol import BACKEND_ENV, DOCTOR_MARKER

#: Messages up to this size are latency-bound: more iterations are cheap and steady the figure.
SMALL = 4096


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m clusterddp.train.bandwidth")
    parser.add_argument("--sizes", default="8,65536,1048576", help="message sizes in bytes, comma-separated")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per size (x4 for small ones)")
    parser.add_argument("--partners", type=int, default=3, help="partner nodes per node for the ping-pong")
    parser.add_argument("--backend", default=None, help="default: the launcher's CLUSTERDDP_BACKEND")
    return parser.parse_args(argv)


def iterations(size: int, iters: int) -> int:
    return iters * 4 if size <= SMALL else iters


def time_allreduce(tensor: torch.Tensor, iters: int, sync: Callable[[], None]) -> float:
    """Seconds per all_reduce, averaged over ``iters`` back-to-back calls after one warm-up."""
    dist.all_reduce(tensor)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    sync()
    return (time.perf_counter() - start) / iters


def ping_pong(tensor: torch.Tensor, peer: int, first: bool, iters: int, sync: Callable[[], None]) -> float:
    """One-way seconds for one message: half the fastest round trip, after one warm-up.

    The fastest, not the mean: interference (other processes, a busy core) only ever adds
    time, so the minimum is the steadiest estimate of what the link can do.
    """
    trips = []
    for i in range(iters + 1):
        start = time.perf_counter()
        if first:
            dist.send(tensor, peer)
            dist.recv(tensor, peer)
        else:
            dist.recv(tensor, peer)
            dist.send(tensor, peer)
        sync()
        if i:
            trips.append(time.perf_counter() - start)
    return min(trips) / 2


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    backend = args.backend or os.environ.get(BACKEND_ENV) or (
        "nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        sync: Callable[[], None] = torch.cuda.synchronize
    else:
        device = torch.device("cpu")
        sync = lambda: None  # noqa: E731 (gloo calls are synchronous)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    nnodes, node = world // nproc, rank // nproc

    allreduce = []
    for size in sizes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        allreduce.append((size, time_allreduce(tensor, iterations(size, args.iters), sync)))

    pairs = []
    for round_pairs in pair_rounds(nnodes, args.partners):
        mine = next(((a, b) for a, b in round_pairs if node in (a, b)), None)
        for size in sizes:
            tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
            dist.barrier()
            if mine is not None and rank % nproc == 0:
                a, b = mine
                peer = (b if node == a else a) * nproc
                seconds = ping_pong(tensor, peer, first=node == a, iters=iterations(size, args.iters), sync=sync)
                if node == a:
                    pairs.append({"a": a, "b": b, "size": size, "seconds": seconds})

    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, {"node": node, "host": socket.gethostname(), "pairs": pairs})
    if rank == 0:
        hosts = {g["node"]: g["host"] for g in gathered if isinstance(g, dict)}
        result = {"backend": backend, "world_size": world, "nnodes": nnodes, "nproc": nproc,
                  "hosts": [hosts.get(n, f"node{n}") for n in range(nnodes)], "allreduce": allreduce,
                  "pairs": [p for g in gathered if isinstance(g, dict) for p in g["pairs"]]}
        print(DOCTOR_MARKER + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
