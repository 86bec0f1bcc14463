"""Optimizer steps that a flag on the device can cancel, and fused optimizers to make them cheap.

The loop learns that a step's loss was not finite on the device long before the host does
(guard.py). To keep the NaN gradient out of the weights without waiting for the host, the
update itself must be cancellable on the device:

* torch's fused SGD, Adam, AdamW and Adagrad read a ``found_inf`` tensor and skip the whole
  update in the kernel when it is 1.0 (weights, momentum and step count unchanged): the way
  ``GradScaler`` drives them without an ``.item()``. ``step_unless`` sets it.
* Any other optimizer on a GPU gets its gradients zeroed on the device when the flag is
  set: the weights stay finite, though momentum and weight decay still move them once. The
  loop stops one step later anyway, and nothing is saved in between. On CPU the flag is in
  host memory already, so the step is simply not taken (exact, and cheaper than a pass
  over the gradients).

``make_optimizer`` builds the fused kinds on CUDA, where a step is a handful of kernel
launches instead of several per parameter, and the scaler needs no host sync either.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

#: Names ``make_optimizer`` knows, and their classes.
KINDS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}

#: Optimizers whose fused step honours ``found_inf`` (torch/optim/{sgd,adam,adagrad}.py).
FOUND_INF_AWARE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad)


def make_optimizer(kind: str, params: Iterable[Any], device: torch.device, *,
                   fused: bool | None = None, **hyper: Any) -> torch.optim.Optimizer:
    """``kind`` ("sgd", "adam", "adamw") with ``hyper``, fused on CUDA unless ``fused=False``.

    ``fused=True`` asks for it on other devices too (torch has CPU kernels; the tests use
    them). SGD with ``dampening`` is left unfused: see ``_prime_momentum``.
    """
    try:
        cls: Any = KINDS[kind.lower()]  # each takes fused=, which the Optimizer base does not declare
    except KeyError:
        raise ValueError(f"unknown optimizer {kind!r}; known: {', '.join(KINDS)}") from None
    use_fused = device.type == "cuda" if fused is None else fused
    if cls is torch.optim.SGD and hyper.get("dampening", 0):
        use_fused = False
    optimizer = cls(params, fused=True if use_fused else None, **hyper)
    if use_fused and cls is torch.optim.SGD:
        _prime_momentum(optimizer)
    return optimizer


def _prime_momentum(optimizer: torch.optim.Optimizer) -> None:
    """Give fused SGD zeroed momentum buffers before its first step.

    Fused SGD allocates them with ``empty_like`` at its first step and fills them in the
    kernel; when that step is skipped (``found_inf``: an fp16 overflow, a NaN), they keep
    whatever the memory held and the next step uses it. With ``dampening == 0`` a zero
    buffer gives exactly the first step's result (0 * momentum + g == g), so priming
    changes no number.
    """
    for group in optimizer.param_groups:
        if group["momentum"] == 0:
            continue
        for param in group["params"]:
            if param.requires_grad and optimizer.state[param].get("momentum_buffer") is None:
                optimizer.state[param]["momentum_buffer"] = torch.zeros_like(
                    param, memory_format=torch.preserve_format)


def honours_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """True when ``optimizer.step`` skips its whole update on ``found_inf == 1`` in the kernel."""
    return isinstance(optimizer, FOUND_INF_AWARE) and all(
        group.get("fused") for group in optimizer.param_groups)


@torch.no_grad()
def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor | None) -> None:
    """``optimizer.step()``, cancelled on the device where ``skip`` (0-dim float) is 1.0."""
    if skip is None:
        optimizer.step()
    elif honours_found_inf(optimizer):
        optimizer.found_inf = skip  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
    elif skip.device.type == "cpu":
        if not skip.item():  # host memory: reading it costs nothing, and the skip is exact
            optimizer.step()
    else:
        zero_grads_where(optimizer, skip)
        optimizer.step()


@torch.no_grad()
def zero_grads_where(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """Zero every gradient where ``skip`` is 1.0, on the device, without reading the flag."""
    zero = skip.bool()
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                param.grad.masked_fill_(zero, 0.0)
