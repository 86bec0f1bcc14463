"""Checkpoints that survive a kill at any moment and resume to the same numbers.

Written by rank 0 only (every rank holds the same weights after DDP's all-reduce), to a
temp file in the target directory, fsync'ed, then renamed over the old one: a reader sees
the old checkpoint or the new one, never a torn file. Besides the unwrapped model
(loadable without DDP), they hold the optimizer, scheduler and AMP scaler states, the
position in training (epoch and step) and every rank's RNG state, so a resumed run draws
the same dropout masks as an uninterrupted one.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
import typing
from typing import Any, Iterator

import torch
from torch import nn

from clusterddp.train.amp import Amp
from clusterddp.train.atomic import atomic_write
from clusterddp.train.dist import DistContext, all_gather_objects, run_on_main
from clusterddp.train.liveness import phase
from clusterddp.train.guard import NonFiniteWeightsError, all_finite
from clusterddp.train.model import unwrap

#: Bumped when the layout below changes incompatibly.
FORMAT_VERSION = 1


@dataclass
class TrainState:
    """Where training stands: resume runs epoch ``epoch`` from batch ``step``."""

    epoch: int = 0
    step: int = 0
    loss_sum: float = 0.0  # sum of the agreed mean losses of steps 0..step-1 of this epoch
    world_size: int = 1    # ranks that ran those steps (a step is world_size batches)
    global_step: int = 0   # steps completed since the start of training, all epochs


def capture_rng() -> dict[str, Any]:
    """This process's RNG states (Python, NumPy, torch CPU and CUDA) in loadable types."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        name, keys, pos, has_gauss, gauss = typing.cast(Any, np.random.get_state())  # the legacy tuple
        state["numpy"] = (name, keys.tolist(), int(pos), int(has_gauss), float(gauss))
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Undo ``capture_rng``; parts missing from ``state`` are left alone."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        import numpy as np
        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save`` that never leaves a torn file (see ``atomic.atomic_write``)."""
    return atomic_write(path, lambda f: torch.save(obj, f))


def _state_tensors(model: nn.Module,
                   optimizer: torch.optim.Optimizer | None) -> Iterator[torch.Tensor]:
    """The model's parameters and buffers, then every tensor of the optimizer's state."""
    yield from unwrap(model).state_dict().values()
    if optimizer is not None:
        for per_param in optimizer.state.values():
            yield from (v for v in per_param.values() if isinstance(v, torch.Tensor))


@phase("checkpoint")  # the launcher's record: a long write is no hang
def save_checkpoint(path: str | os.PathLike[str], ctx: DistContext, *, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, amp: Amp | None = None,
                    state: TrainState | None = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint from rank 0; every rank must call it (RNG states are gathered).

    Returns the path on every rank once the file is complete; if rank 0 fails to write,
    every rank raises. No checkpoint holds a NaN or an infinity: each rank checks its
    weights and optimizer state, the answers travel with the RNG states, and if any rank's
    are not finite every rank raises ``NonFiniteWeightsError`` and nothing is written
    (training loss checks cannot see a finite loss whose update overflowed).
    """
    finite = all_finite(_state_tensors(model, optimizer))
    gathered = all_gather_objects((capture_rng(), finite))
    bad = [rank for rank, (_, ok) in enumerate(gathered) if not ok]
    if bad:
        raise NonFiniteWeightsError(str(path), bad)
    rng_states = [rng for rng, _ in gathered]

    def write() -> Path:
        payload = {
            "format": FORMAT_VERSION,
            "model": unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": amp.state_dict() if amp is not None else None,
            "train_state": asdict(state or TrainState()),
            "world_size": ctx.world_size,
            "rng": rng_states,
            "extra": extra or {},
        }
        return atomic_save(payload, path)

    run_on_main(write, f"writing checkpoint {path}")
    return Path(path)


@phase("restore")
def load_checkpoint(path: str | os.PathLike[str], ctx: DistContext, *, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, amp: Amp | None = None,
                    map_location: str | torch.device | None = None,
                    restore_rng_state: bool = True) -> tuple[TrainState, dict[str, Any]]:
    """Load a checkpoint on this rank and return (where to continue, the ``extra`` dict).

    Every rank calls it, with ``map_location`` defaulting to the rank's own device, so a
    checkpoint written from ``cuda:0`` does not pile every rank's copy onto GPU 0. Loaded
    with ``weights_only=True``: a checkpoint is data and must not run code. Each rank gets
    its own RNG state back when the world size is unchanged; otherwise rank r takes rank
    ``r % saved_world_size``'s (training continues, but not bit-for-bit).
    """
    checkpoint = torch.load(path, map_location=map_location or ctx.device, weights_only=True)
    version = checkpoint.get("format")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {version!r}, this clusterddp reads "
                         f"{FORMAT_VERSION}")
    unwrap(model).load_state_dict(checkpoint["model"])
    if optimizer is not None and checkpoint["optimizer"] is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scheduler is not None and checkpoint["scheduler"] is not None:
        scheduler.load_state_dict(checkpoint["scheduler"])
    if amp is not None and checkpoint["scaler"]:
        amp.load_state_dict(checkpoint["scaler"])
    if restore_rng_state and checkpoint.get("rng"):
        states = checkpoint["rng"]
        restore_rng(states[ctx.rank % len(states)])
    return TrainState(**checkpoint["train_state"]), checkpoint.get("extra", {})
