"""Preparing a model for DDP: same initial weights, SyncBatchNorm, freezing, LR scaling.

Order matters and ``prepare_model`` encodes it: freeze and convert BatchNorm *before*
wrapping in DDP (DDP records which parameters need gradients when it is built), then wrap.
"""

from __future__ import annotations

import fnmatch
import sys
import weakref
from typing import Any, Callable, ContextManager, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from clusterddp.train.dist import DistContext


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP (or ``torch.compile``), for saving and evaluating."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


@torch.no_grad()
def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank, in place, over the wire.

    This replaces the seeds' trick of saving rank 0's weights to a temp file that the other
    ranks load: that needs a /tmp shared by all nodes, which clusters rarely have.

    You do NOT need this when the model is wrapped in ``DistributedDataParallel``: its
    constructor already broadcasts parameters and buffers from rank 0. It is needed when the
    weights are used before wrapping in a way that must agree across ranks (evaluating a
    randomly initialised model, copying it into an EMA or a teacher, choosing what to freeze
    from weight values), or when training without DDP (manual gradient all-reduce).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=src)


def convert_sync_batchnorm(model: nn.Module, ctx: DistContext, enabled: bool = True) -> nn.Module:
    """Replace BatchNorm layers by SyncBatchNorm when it helps and is possible.

    SyncBatchNorm computes batch statistics over the global batch instead of each rank's
    slice, which matters when per-rank batches are small. torch implements it for GPUs only
    and a single process gains nothing, so on CPU or without a process group the model is
    returned unchanged and rank 0 says why.
    """
    if not enabled:
        return model
    if not ctx.distributed:
        return model
    if ctx.device.type == "cpu":
        if ctx.is_main:
            print("clusterddp.train: SyncBatchNorm needs GPUs (torch has no CPU version); "
                  "keeping per-rank BatchNorm", file=sys.stderr, flush=True)
        return model
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def freeze_parameters(model: nn.Module, patterns: Sequence[str],
                      keep: Sequence[str] = ()) -> list[str]:
    """Stop training parameters whose names match a glob in ``patterns`` unless in ``keep``.

    Globs use fnmatch on ``named_parameters()`` names: ``["*"], keep=["fc.*"]`` trains only
    the classifier (the seeds' fine-tuning recipe); ``["layer1.*", "conv1.*"]`` freezes the
    stem. A pattern that matches nothing raises: a typo would otherwise silently train
    everything. Returns the frozen names. Call before wrapping in DDP.
    """
    names = [name for name, _ in model.named_parameters()]
    for pattern in list(patterns) + list(keep):
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ValueError(f"freeze pattern {pattern!r} matches no parameter; "
                             f"names look like {names[:3]}")
    frozen = []
    for name, param in model.named_parameters():
        if _matches(name, patterns) and not _matches(name, keep):
            param.requires_grad_(False)
            frozen.append(name)
    return frozen


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def scale_lr(lr: float, world_size: int, rule: str = "linear") -> float:
    """Learning rate for a global batch ``world_size`` times the per-rank batch.

    Opt-in: the seeds always multiplied lr by world_size, which silently changes the recipe
    when the same script moves from 1 to 8 GPUs. ``linear`` is Goyal et al.'s rule (use it
    with warm-up); ``sqrt`` suits adaptive optimizers; ``none`` returns ``lr``.
    """
    if rule == "linear":
        return lr * world_size
    if rule == "sqrt":
        return lr * world_size ** 0.5
    if rule == "none":
        return lr
    raise ValueError(f"unknown lr scaling rule {rule!r}; known: linear, sqrt, none")


def wrap_ddp(model: nn.Module, ctx: DistContext, **ddp_kwargs: object) -> nn.Module:
    """Move to the rank's device and wrap in DDP; a single process gets the bare module.

    ``find_unused_parameters`` stays off by default: it costs a graph traversal per step.
    """
    model = model.to(ctx.device)
    if not ctx.distributed:
        return model
    if ctx.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [ctx.device.index])
        ddp_kwargs.setdefault("output_device", ctx.device.index)
    return DistributedDataParallel(model, **ddp_kwargs)  # type: ignore[arg-type]


def prepare_model(model: nn.Module, ctx: DistContext, *, sync_bn: bool = False,
                  freeze: Sequence[str] = (), keep: Sequence[str] = (),
                  **ddp_kwargs: object) -> nn.Module:
    """Freeze, convert BatchNorm, then wrap in DDP: the order DDP requires."""
    if freeze:
        frozen = freeze_parameters(model, freeze, keep)
        if ctx.is_main:
            print(f"clusterddp.train: froze {len(frozen)} parameter tensors", file=sys.stderr,
                  flush=True)
    model = convert_sync_batchnorm(model, ctx, enabled=sync_bn)
    return wrap_ddp(model, ctx, **ddp_kwargs)


#: DDP models whose gradient buckets are already in their final order (see settle_buckets).
_SETTLED: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def settle_buckets(model: nn.Module, inputs: Any, autocast: Callable[[], ContextManager[Any]]) -> bool:
    """Give DDP its final gradient buckets before the first real step of this process.

    DDP starts with one bucket of every parameter in definition order, and after its first
    backward regroups them by the order their gradients became ready (``rebuild_buckets``).
    Where a parameter sits in a bucket decides the order in which a ring all-reduce over 3
    or more ranks adds the ranks' values, so the first step of every process sums in another
    order than all the others: a run resumed at step k differs from an uninterrupted one in
    the last bits, because its step k was a first step and the uninterrupted run's was not.

    This runs one forward and backward on ``inputs`` (the first batch) and throws the
    gradients away; the next forward rebuilds the buckets, so every step that updates the
    weights, the first one of a fresh start and of a resume alike, uses the same buckets.
    Buffers (BatchNorm statistics) and the RNG state (dropout) are put back as they were,
    so the step itself is unchanged. Only for a DDP model that regroups (not with
    ``find_unused_parameters=True``, which keeps the first grouping), once per model.
    Returns whether it ran.
    """
    if not isinstance(model, DistributedDataParallel) or model in _SETTLED:
        return False
    _SETTLED.add(model)
    if model.find_unused_parameters and not model.static_graph:
        return False
    buffers = [buffer.detach().clone() for buffer in model.module.buffers()]
    devices = sorted({t.device.index or 0 for t in _tensors(inputs) if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        with autocast():
            outputs = [t for t in _tensors(model(inputs)) if t.requires_grad]
        if outputs:
            torch.stack([t.float().sum() for t in outputs]).sum().backward()
    with torch.no_grad():
        for buffer, saved in zip(model.module.buffers(), buffers):
            buffer.copy_(saved)
    for param in model.parameters():
        param.grad = None
    return True


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a model's input or output (a tensor, or lists, tuples, dicts of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
