"""Per-rank progress for a Lightning script with one callback::

    from clusterddp.train.lightning import ProgressCallback
    trainer = L.Trainer(..., callbacks=[ProgressCallback()])

Each training batch ends with one ``heartbeat(step, compute_s)`` (the progress file of
``clusterddp.train.liveness``: the launcher's hang detection, straggler naming, the restart
verdict and the report read it), ``step`` being ``trainer.global_step``; validation is the
phase ``eval`` and every ``trainer.save_checkpoint`` (``ModelCheckpoint``'s included) the
phase ``checkpoint``, so neither is taken for a hang nor counted as training.

``compute_s`` is the rank's own work in the step outside collectives, as ``fit`` measures it:
from the batch's start to ``on_before_backward`` (moving the batch, the forward pass, the
loss), plus from ``on_before_optimizer_step`` to the batch's end (the optimizer step).
Backward is left out: under DDP it ends waiting for the gradient all-reduce.

The callback class is created on first use (``ProgressCallback`` is looked up in this
module's ``__getattr__``), so ``import clusterddp.train`` and this module never import
Lightning; ``lightning.pytorch`` is used, else the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

from clusterddp.train.liveness import PhaseMarks, heartbeat, lazy_callback

EVAL = "eval"
CHECKPOINT = "checkpoint"


class ProgressHooks:
    """The callback's behaviour, without Lightning's base class (mixed in by ``liveness.lazy_callback``)."""

    def __init__(self) -> None:
        self._phases = PhaseMarks()
        self._mark: float | None = None   # start of the current span of the rank's own work
        self._compute = 0.0
        self._measured = False
        self._trainer: Any = None
        self._save: Callable[..., Any] | None = None

    # -- steps -------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._compute, self._measured = 0.0, False
        self._mark = time.perf_counter()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._close_span()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._mark = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._close_span()
        heartbeat(int(trainer.global_step), self._compute if self._measured else None)

    def _close_span(self) -> None:
        if self._mark is not None:
            self._compute += time.perf_counter() - self._mark
            self._measured = True
            self._mark = None

    # -- phases ------------------------------------------------------------------------------

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._phases.enter(EVAL)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._phases.leave(EVAL)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Wrap this trainer's ``save_checkpoint`` (Lightning has no hook after a save is
        written: ``on_save_checkpoint`` comes before, while the dict is built)."""
        if self._save is not None:
            return
        self._trainer, self._save = trainer, trainer.save_checkpoint
        save, phases = trainer.save_checkpoint, self._phases

        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            phases.enter(CHECKPOINT)
            try:
                return save(*args, **kwargs)
            finally:
                phases.leave(CHECKPOINT)

        trainer.save_checkpoint = save_checkpoint

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Close what is open and give the trainer its own ``save_checkpoint`` back."""
        self._phases.leave_all()
        if self._save is not None and self._trainer is trainer:
            trainer.save_checkpoint = self._save
            self._trainer, self._save = None, None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._phases.leave_all()


def _base() -> type:
    try:
        base: type = importlib.import_module("lightning.pytorch").Callback
    except ImportError:
        base = importlib.import_module("pytorch_lightning").Callback  # the older package name
    return base


__getattr__ = lazy_callback(__name__, ProgressHooks, _base)
