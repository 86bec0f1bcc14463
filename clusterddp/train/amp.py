"""Mixed precision with ``torch.amp``, replacing the seeds' apex.

On CUDA: float16 autocast plus a ``GradScaler`` (float16 gradients underflow without
loss scaling). On CPU: bfloat16 autocast and no scaler (bfloat16 has float32's exponent
range, so nothing underflows). Disabled, every method is a plain pass-through, so the
training loop has one code path.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch


@dataclass
class Amp:
    """Autocast and (on CUDA) loss scaling for one device."""

    device: torch.device
    enabled: bool = False
    dtype: torch.dtype = field(init=False)
    scaler: torch.amp.GradScaler = field(init=False)

    def __post_init__(self) -> None:
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
        use_scaler = self.enabled and self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=use_scaler)

    def autocast(self) -> ContextManager[Any]:
        """Context for the forward pass and the loss."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled when a scaler is active."""
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step (skipped by the scaler when gradients overflowed) and scale update."""
        if self.scaler.is_enabled():
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state for checkpoints (empty when no scaler is active)."""
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scaler; an empty state (checkpoint from a run without one) is ignored."""
        if state and self.scaler.is_enabled():
            self.scaler.load_state_dict(state)
