"""One small all-reduce per step that every rank takes part in: loss, NaN, preemption.

The seeds checked ``torch.isfinite(loss)`` locally and called ``sys.exit`` on the rank that
saw a NaN; the other ranks then waited in the next all-reduce until the collective timeout.
Here each rank contributes (finite loss sum, non-finite flag, preemption flag) to one
all-reduce before the backward pass, so every rank learns the same verdict at the same step
and they all stop together. The reduced loss is the mean loss the progress bar shows, the
all-reduce the seeds already paid for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from clusterddp.train.dist import DistContext, all_gather_objects
from clusterddp.train.exitcodes import NONFINITE_LOSS_EXIT_CODE


class NonFiniteLossError(RuntimeError):
    """The loss was NaN or infinite on some rank; raised on every rank at the same step."""

    exit_code = NONFINITE_LOSS_EXIT_CODE

    def __init__(self, epoch: int, step: int, values: dict[int, float], world_size: int) -> None:
        self.epoch = epoch
        self.step = step
        self.values = values  # rank -> its non-finite loss
        where = ", ".join(f"rank {r} ({v})" for r, v in sorted(values.items()))
        super().__init__(
            f"non-finite loss at epoch {epoch} step {step} on {where}; stopped all "
            f"{world_size} rank(s) before the backward pass. Lower the learning rate, check "
            "the inputs of that step, or turn AMP off")


@dataclass(frozen=True)
class StepVerdict:
    """What all ranks agreed on for one step."""

    mean_loss: float  # mean over ranks of this step's loss
    preempt: bool     # some rank was asked to stop


def agree_step(loss: torch.Tensor, preempt_requested: bool, ctx: DistContext, *,
               epoch: int, step: int) -> StepVerdict:
    """Share this rank's loss and flags; raise ``NonFiniteLossError`` on every rank if needed.

    Must be called by every rank at every step (it is a collective).
    """
    local = loss.detach().float().reshape(())
    finite = torch.isfinite(local)
    packed = torch.stack([
        torch.where(finite, local, torch.zeros_like(local)),
        (~finite).float(),
        torch.tensor(float(preempt_requested), device=local.device),
    ])
    if ctx.distributed:
        dist.all_reduce(packed)
    loss_sum, bad_ranks, preempt = packed.tolist()
    if bad_ranks > 0:
        mine = None if math.isfinite(local.item()) else local.item()
        everyone = all_gather_objects(mine)
        values = {rank: v for rank, v in enumerate(everyone) if v is not None}
        raise NonFiniteLossError(epoch, step, values, ctx.world_size)
    return StepVerdict(mean_loss=loss_sum / ctx.world_size, preempt=preempt > 0)
