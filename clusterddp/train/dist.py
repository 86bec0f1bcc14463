"""Process group setup and the handful of collectives every training script needs.

``init_distributed()`` is safe to call in any process: under torchrun, the clusterddp
launcher, ``torch.distributed.launch`` or ``srun`` it joins the job; run as a plain
``python train.py`` it returns a single-process context and every helper here becomes a
no-op, so one script serves both.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence, TypeVar

import torch
import torch.distributed as dist

from clusterddp.protocol import BACKEND_ENV  # the backend the launcher chose from the job file
from clusterddp.train.distenv import DistEnv, DistEnvError, read_dist_env

#: Seconds a collective may wait for a peer before failing; overrides the default below.
TIMEOUT_ENV = "CLUSTERDDP_DIST_TIMEOUT"

#: torch's own default for gloo. Long, because rank 0 may legitimately be busy (writing a
#: checkpoint, evaluating) while the others wait in a barrier.
DEFAULT_TIMEOUT = timedelta(minutes=30)

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """What a training script needs to know about its place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None when no process group was created
    source: str

    @property
    def distributed(self) -> bool:
        """True when a process group exists and collectives talk to other ranks."""
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, logs and writes checkpoints."""
        return self.rank == 0


_context: DistContext | None = None


def _pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _pick_backend(requested: str | None, device: torch.device) -> str:
    name = (requested or os.environ.get(BACKEND_ENV) or "auto").lower()
    if name == "auto":
        return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    if name == "nccl" and device.type != "cuda":
        raise DistEnvError("backend nccl needs CUDA, and this process sees no GPU; "
                           "use backend gloo (or auto) for CPU training")
    return name


def _pick_timeout(timeout: timedelta | float | None) -> timedelta:
    if isinstance(timeout, timedelta):
        return timeout
    if timeout is not None:
        return timedelta(seconds=float(timeout))
    raw = os.environ.get(TIMEOUT_ENV)
    if raw:
        try:
            return timedelta(seconds=float(raw))
        except ValueError:
            raise DistEnvError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    return DEFAULT_TIMEOUT


def _share_cores(where: DistEnv, env: Mapping[str, str]) -> None:
    # N ranks on one node each starting one thread per core oversubscribe the CPU many
    # times over (torchrun sets OMP_NUM_THREADS=1 for this reason). Unless the user chose,
    # give each rank its share of the cores.
    if where.local_world_size <= 1 or "OMP_NUM_THREADS" in env:
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // where.local_world_size))


def _init_method(where: DistEnv) -> str:
    host = f"[{where.master_addr}]" if ":" in where.master_addr else where.master_addr
    return f"tcp://{host}:{where.master_port}"


def init_distributed(backend: str | None = None, timeout: timedelta | float | None = None,
                     env: Mapping[str, str] | None = None,
                     argv: Sequence[str] | None = None) -> DistContext:
    """Join the job described by the environment, or return a single-process context.

    ``backend``: ``nccl``, ``gloo`` or ``auto`` (nccl with CUDA, else gloo); default from
    ``$CLUSTERDDP_BACKEND``, then auto. ``timeout``: how long a collective waits for a
    missing peer (seconds or timedelta; default ``$CLUSTERDDP_DIST_TIMEOUT`` or 30 min).
    The rendezvous address is passed to torch explicitly, so ``os.environ`` is left as found.
    Calling it twice returns the first context.
    """
    global _context
    if _context is not None and (not _context.distributed or dist.is_initialized()):
        return _context
    where = read_dist_env(os.environ if env is None else env,
                          sys.argv[1:] if argv is None else argv)
    device = _pick_device(where.local_rank)
    _share_cores(where, os.environ if env is None else env)
    if not where.distributed:
        _context = DistContext(rank=0, world_size=1, local_rank=where.local_rank,
                               local_world_size=where.local_world_size, device=device,
                               backend=None, source=where.source)
        return _context
    chosen = _pick_backend(backend, device)
    dist.init_process_group(backend=chosen, init_method=_init_method(where), rank=where.rank,
                            world_size=where.world_size, timeout=_pick_timeout(timeout))
    _context = DistContext(rank=where.rank, world_size=where.world_size,
                           local_rank=where.local_rank, local_world_size=where.local_world_size,
                           device=device, backend=chosen, source=where.source)
    return _context


def current_context() -> DistContext:
    """The context from ``init_distributed()``, or a single-process one before it is called."""
    if _context is not None:
        return _context
    return DistContext(rank=0, world_size=1, local_rank=0, local_world_size=1,
                       device=torch.device("cpu"), backend=None, source="single")


def cleanup() -> None:
    """Leave the process group (call in ``finally``): lets NCCL/gloo close sockets cleanly.

    DDP modules sit in reference cycles that keep the process group alive past
    ``destroy_process_group``; when the cycle is finally freed at interpreter exit, gloo's
    destructor can abort the process ("terminate called without an active exception",
    exit -6) after a successful run. Collecting first frees them while the group is sound.
    """
    global _context
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
    _context = None


def get_rank() -> int:
    """Global rank, 0 without a process group."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    """Number of ranks, 1 without a process group."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """Rank 0 (also true in a single process)."""
    return get_rank() == 0


def barrier() -> None:
    """Wait for every rank; a no-op in a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "nccl":
        # Without device_ids NCCL guesses the device and warns that it may hang.
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def reduce_value(value: T, average: bool = True) -> T:
    """Sum (or mean) of ``value`` over all ranks; tensors stay tensors, numbers stay numbers.

    The input tensor is not modified (the seeds reduced in place and then logged a value
    that no longer was the local loss).
    """
    world = get_world_size()
    if isinstance(value, torch.Tensor):
        if world == 1:
            return value
        out = value.detach().clone()
        dist.all_reduce(out)
        if average:
            out /= world
        return out  # type: ignore[return-value]
    if world == 1:
        return value
    ctx = current_context()
    out = torch.tensor(float(value), dtype=torch.float64, device=ctx.device)  # type: ignore[arg-type]
    dist.all_reduce(out)
    total = out.item()
    return (total / world if average else total)  # type: ignore[return-value]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order (picklable objects; for rare, small exchanges)."""
    if get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def run_on_main(fn: Callable[[], T], what: str) -> T | None:
    """Run ``fn`` on rank 0 only, and make every rank learn whether it worked.

    Other ranks wait for the outcome instead of a bare barrier: if rank 0 fails (disk full
    while writing a checkpoint), every rank raises at once, rather than rank 0 dying while
    the rest sit in a barrier until the collective timeout. Returns ``fn``'s result on
    rank 0 and None elsewhere.
    """
    if get_world_size() == 1:
        return fn()
    result: T | None = None
    outcome: list[Any] = [None]
    if get_rank() == 0:
        try:
            result = fn()
            outcome[0] = (True, "")
        except Exception as exc:  # reported on every rank below
            outcome[0] = (False, f"{type(exc).__name__}: {exc}")
            error: Exception | None = exc
        else:
            error = None
    dist.broadcast_object_list(outcome, src=0)
    ok, message = outcome[0]
    if get_rank() == 0:
        if error is not None:
            raise error
        return result
    if not ok:
        raise RuntimeError(f"rank 0 failed while {what}: {message}")
    return None
