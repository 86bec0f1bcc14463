"""Exact distributed evaluation: every sample counted once, integer counts summed.

The seeds evaluated with ``DistributedSampler``, which pads the data set to a multiple of
the world size by repeating samples, and divided the summed correct count by
``sampler.total_size`` (the padded size): on a 10 001-image set with 2 ranks one image was
counted twice. Here each rank evaluates its unpadded shard (``make_eval_loader``) and the
ranks sum (correct, seen) once at the end, so the accuracy is the single-process one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from clusterddp.train.amp import Amp
from clusterddp.train.dist import DistContext
from clusterddp.train.liveness import phase
from clusterddp.train.model import unwrap


@dataclass(frozen=True)
class EvalResult:
    """Totals over the whole data set (all ranks)."""

    correct: int
    total: int
    loss_sum: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.total if self.total else float("nan")


def check_unpadded(loader: DataLoader) -> None:
    """Refuse a loader whose sampler repeats samples: its accuracy would be wrong."""
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler) and not sampler.drop_last \
            and sampler.total_size != len(sampler.dataset):  # type: ignore[arg-type]
        raise ValueError(
            f"evaluation loader uses DistributedSampler, which pads {len(sampler.dataset)} "  # type: ignore[arg-type]
            f"samples to {sampler.total_size} by repeating some; build it with make_eval_loader")


def move_to(batch: Any, device: torch.device) -> Any:
    """Tensors in (nested) tuples, lists and dicts moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    return batch


@phase("eval")  # the launcher's record: evaluation, not a stalled step
@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, ctx: DistContext, *,
             criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
             amp: Amp | None = None) -> EvalResult:
    """Top-1 accuracy (and mean loss with ``criterion``) over the loader's whole data set.

    Batches are ``(inputs, targets)``. Runs the unwrapped module: DDP adds nothing to a
    forward pass without gradients, and ranks may see different numbers of batches, so
    nothing per batch may be a collective. Every rank returns the same totals.
    """
    check_unpadded(loader)
    module = unwrap(model)
    was_training = module.training
    module.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    try:
        for inputs, targets in loader:
            inputs, targets = move_to(inputs, ctx.device), move_to(targets, ctx.device)
            with amp.autocast() if amp is not None else torch.autocast(ctx.device.type, enabled=False):
                outputs = module(inputs)
            totals[0] += (outputs.argmax(dim=1) == targets).sum()
            totals[1] += targets.numel()
            if criterion is not None:
                totals[2] += criterion(outputs.float(), targets).double() * targets.numel()
    finally:
        module.train(was_training)
    if ctx.distributed:
        # Counts stay exact: float64 holds integers up to 2**53.
        dist.all_reduce(totals)
    correct, total, loss_sum = totals.tolist()
    return EvalResult(correct=int(correct), total=int(total), loss_sum=loss_sum)
