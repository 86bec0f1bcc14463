"""One small all-reduce per step that every rank takes part in: loss, NaN, preemption.

The seeds checked ``torch.isfinite(loss)`` locally and called ``sys.exit`` on the rank that
saw a NaN; the other ranks then waited in the next all-reduce until the collective timeout.
Here each rank contributes (loss, preemption flag) to one all-reduce; a sum that is not
finite means some rank's loss was not, so every rank learns the same verdict at the same
step and they all stop together, before the optimizer step (the weights never take a NaN gradient). The reduced
loss is the mean loss the progress bar shows: the all-reduce the seeds already paid for.

The all-reduce is started right after the forward pass and waited for after the backward
pass, so it travels while DDP's gradient all-reduces are being computed: it adds no
synchronisation point of its own, as a blocking check before backward would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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
        where = ", ".join(f"rank {r} ({v})" for r, v in sorted(values.items())) or \
            "no single rank (the finite losses overflowed when summed)"
        super().__init__(
            f"non-finite loss at epoch {epoch} step {step} on {where}; stopped all "
            f"{world_size} rank(s) before the optimizer step. Lower the learning rate, check "
            "the inputs of that step, or turn AMP off")


@dataclass(frozen=True)
class StepVerdict:
    """What all ranks agreed on for one step."""

    mean_loss: float  # mean over ranks of this step's loss
    preempt: bool     # some rank was asked to stop


class PendingVerdict:
    """An agreement in flight: started after forward, read after backward."""

    def __init__(self, local: torch.Tensor, packed: torch.Tensor, work: Any, ctx: DistContext) -> None:
        self._local = local
        self._packed = packed
        self._work = work
        self._ctx = ctx

    def result(self, *, epoch: int, step: int) -> StepVerdict:
        """Wait for the all-reduce; raise ``NonFiniteLossError`` on every rank if needed."""
        if self._work is not None:
            self._work.wait()
        loss_sum, preempt = self._packed.tolist()
        if not math.isfinite(loss_sum):
            # Finite losses sum to a finite number: some rank's loss was NaN or infinite.
            value = self._local.item()
            everyone = all_gather_objects(None if math.isfinite(value) else value)
            values = {rank: v for rank, v in enumerate(everyone) if v is not None}
            raise NonFiniteLossError(epoch, step, values, self._ctx.world_size)
        return StepVerdict(mean_loss=loss_sum / self._ctx.world_size, preempt=preempt > 0)


def start_agreement(loss: torch.Tensor, preempt_requested: bool, ctx: DistContext) -> PendingVerdict:
    """Start sharing this rank's loss and flags (a collective: every rank, every step)."""
    local = loss.detach().float().reshape(())
    packed = torch.stack((local, local.new_tensor(float(preempt_requested))))
    work = dist.all_reduce(packed, async_op=True) if ctx.distributed else None
    return PendingVerdict(local, packed, work, ctx)


def agree_step(loss: torch.Tensor, preempt_requested: bool, ctx: DistContext, *,
               epoch: int, step: int) -> StepVerdict:
    """``start_agreement`` and its ``result`` at once, for loops without overlap."""
    return start_agreement(loss, preempt_requested, ctx).result(epoch=epoch, step=step)
