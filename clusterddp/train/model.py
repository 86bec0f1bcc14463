"""Preparing a model for DDP: same initial weights, SyncBatchNorm, freezing, LR scaling.

Order matters and ``prepare_model`` encodes it: freeze and convert BatchNorm *before*
wrapping in DDP (DDP records which parameters need gradients when it is built), then wrap.
"""

from __future__ import annotations

import fnmatch
import sys
from typing import Iterable, Sequence

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
