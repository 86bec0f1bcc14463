"""Per-rank progress for a Hugging Face ``Trainer`` script with one callback::

    from clusterddp.train.hf import ProgressCallback
    trainer = Trainer(..., callbacks=[ProgressCallback()])

Each optimizer step ends with one ``heartbeat(step, compute_s)`` (``on_step_end``, ``step``
being ``state.global_step``), the progress file the launcher's hang detection, straggler
naming, restart verdict and report read. Evaluation is the phase ``eval`` (from the step end
that decided to evaluate, or the first prediction step of a ``trainer.evaluate()`` call, to
``on_evaluate``) and a checkpoint save the phase ``checkpoint`` (from the step end, or the
evaluation, that decided to save, to ``on_save``). With ``save_strategy="best"`` the Trainer
decides to save only after ``on_evaluate``: that save is not announced.

``compute_s``: the Trainer has no hook between the forward pass and backward, so the rank's
own work is timed with hooks on the model: its forward passes (``register_forward_pre_hook``
and ``register_forward_hook`` on the model the Trainer trains, inside any DDP wrapper; the
loss is usually computed in the forward), plus the optimizer step
(``on_pre_optimizer_step`` to ``on_optimizer_step``). Backward is left out: under DDP it ends
waiting for the gradient all-reduce. Evaluation's forward passes are not counted in steps.

The callback class is created on first use (this module's ``__getattr__``), so
``import clusterddp.train`` and this module never import transformers.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

from clusterddp.train.liveness import PhaseMarks, heartbeat, lazy_callback

EVAL = "eval"
CHECKPOINT = "checkpoint"


class ProgressHooks:
    """The callback's behaviour, without transformers' base class (mixed in by ``liveness.lazy_callback``)."""

    def __init__(self) -> None:
        self._phases = PhaseMarks()
        self._compute = 0.0
        self._measured = False
        self._forward_began: float | None = None
        self._optimizer_began: float | None = None
        self._handles: list[Any] = []

    # -- the model's forward passes ----------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None and hasattr(model, "register_forward_hook") and not self._handles:
            self._handles = [model.register_forward_pre_hook(self._forward_pre),
                             model.register_forward_hook(self._forward_post)]

    def _forward_pre(self, module: Any, inputs: Any) -> None:
        if module.training:
            self._forward_began = time.perf_counter()

    def _forward_post(self, module: Any, inputs: Any, output: Any) -> None:
        if self._forward_began is not None:
            self._compute += time.perf_counter() - self._forward_began
            self._measured = True
            self._forward_began = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._phases.leave_all()

    # -- steps -------------------------------------------------------------------------------

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._compute, self._measured = 0.0, False

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._optimizer_began = time.perf_counter()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._optimizer_began is not None:
            self._compute += time.perf_counter() - self._optimizer_began
            self._measured = True
            self._optimizer_began = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        heartbeat(int(state.global_step), self._compute if self._measured else None)
        self._compute, self._measured = 0.0, False
        self._announce_next(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._announce_next(control)

    def _announce_next(self, control: Any) -> None:
        """The Trainer evaluates, then saves, right after these hooks when its flags say so
        (``DefaultFlowCallback``, which runs before user callbacks, has set them)."""
        if getattr(control, "should_evaluate", False):
            self._phases.enter(EVAL)
        elif getattr(control, "should_save", False):
            self._phases.enter(CHECKPOINT)

    # -- phases ------------------------------------------------------------------------------

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.enter(EVAL)  # a trainer.evaluate() called outside training

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.leave(EVAL)
        if getattr(control, "should_save", False):
            self._phases.enter(CHECKPOINT)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.leave(CHECKPOINT)


def _base() -> type:
    base: type = importlib.import_module("transformers").TrainerCallback
    return base


__getattr__ = lazy_callback(__name__, ProgressHooks, _base)
