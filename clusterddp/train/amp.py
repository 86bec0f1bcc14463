"""Mixed precision with ``torch.amp`` that fits the device, replacing the seeds' apex.

Three modes. ``bf16``: bfloat16 autocast and no scaler; bfloat16 has float32's exponent
range, so gradients do not underflow and nothing needs scaling (GPUs of compute capability
8.0 and up, i.e. A100/H100 and later, and CPUs). ``fp16``: float16 autocast plus a
``GradScaler``, for older GPUs (V100, T4) whose tensor cores have no bfloat16; float16
gradients underflow without loss scaling. ``off``: every method is a pass-through, so the
training loop has one code path.

``True`` (and ``"auto"``) picks the best the device has: bf16 where supported, else fp16
on CUDA. (``True`` used to mean fp16 on every GPU; on an A100 or H100 it now means bf16,
which needs no scaler, and so no scaler state or overflow-skipped steps.)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch

from clusterddp.train.optim import step_unless

#: Names a job may give (``--amp``, ``FitConfig.amp``).
AMP_MODES = ("auto", "bf16", "fp16", "off")

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def bf16_capable(device: torch.device) -> bool:
    """bfloat16 tensor cores: compute capability 8.0 and up on CUDA (ROCm: always); CPUs yes."""
    if device.type != "cuda":
        return True
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def choose_amp(request: bool | str | None, device: torch.device) -> str:
    """The mode for ``request`` (True/False/None or a name of ``AMP_MODES``) on ``device``."""
    name = "auto" if request is True else "off" if request is False or request is None else request
    if not isinstance(name, str) or name.lower() not in AMP_MODES:
        raise ValueError(f"amp={request!r}: use True, False or one of {', '.join(AMP_MODES)}")
    name = name.lower()
    if name == "auto":
        return "bf16" if bf16_capable(device) else "fp16"
    if name == "bf16" and not bf16_capable(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"amp=bf16: {torch.cuda.get_device_name(device)} (compute capability "
                         f"{major}.{minor}) has no bfloat16 tensor cores (8.0 and up do); "
                         "use fp16 (or auto)")
    return name


@dataclass
class Amp:
    """Autocast and, for fp16, loss scaling for one device.

    ``enabled``: True/False (True: the best mode for the device) or a name of ``AMP_MODES``.
    """

    device: torch.device
    enabled: bool | str = False
    mode: str = field(init=False)
    dtype: torch.dtype | None = field(init=False)
    scaler: torch.amp.GradScaler = field(init=False)

    def __post_init__(self) -> None:
        self.mode = choose_amp(self.enabled, self.device)
        self.dtype = _DTYPES.get(self.mode)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.mode == "fp16")

    def autocast(self) -> ContextManager[Any]:
        """Context for the forward pass and the loss."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled when a scaler is active."""
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, skip: torch.Tensor | None = None) -> None:
        """Optimizer step, cancelled on the device where ``skip`` is 1.0, and the scale update.

        With a scaler, ``skip`` joins the scaler's own overflow flag, so one test decides;
        fused optimizers then need no host sync (others: GradScaler calls ``.item()``).
        """
        if not self.scaler.is_enabled():
            step_unless(optimizer, skip)
            return
        if skip is not None:
            self.scaler.unscale_(optimizer)
            # No public setter: the per-device flags unscale_ just computed (0.0 or 1.0;
            # fused kernels skip on exactly 1.0, hence maximum, not a sum).
            for found in self.scaler._found_inf_per_device(optimizer).values():
                torch.maximum(found, skip.to(found.device), out=found)
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state for checkpoints (empty when no scaler is active)."""
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scaler; an empty state (checkpoint from a run without one) is ignored."""
        if state and self.scaler.is_enabled():
            self.scaler.load_state_dict(state)
