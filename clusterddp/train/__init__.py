"""DDP training helpers: the only part of clusterddp that imports torch.

A script written with them runs unchanged as ``python train.py`` (one process), under
torchrun, under the clusterddp launcher, under ``torch.distributed.launch`` and under
``srun`` (one task per GPU)::

    from clusterddp import train as T

    def main() -> None:
        ctx = T.init_distributed()
        model = T.prepare_model(build_model(), ctx, sync_bn=True)
        loader = T.make_train_loader(train_set, 64, ctx)
        T.fit(model, optimizer, loader, criterion, ctx, T.FitConfig(epochs=10, ...),
              eval_loader=T.make_eval_loader(test_set, 256, ctx))

    T.run_main(main)

Names are loaded on first use (PEP 562), so ``import clusterddp.train.exitcodes`` and
``clusterddp.train.liveness`` stay torch-free for the launcher.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the submodule that defines it.
_EXPORTS = {
    # dist
    "DistContext": "dist", "init_distributed": "dist", "cleanup": "dist", "get_rank": "dist",
    "get_world_size": "dist", "is_main_process": "dist", "barrier": "dist",
    "reduce_value": "dist", "all_gather_objects": "dist", "run_on_main": "dist",
    "current_context": "dist",
    # model
    "broadcast_parameters": "model", "convert_sync_batchnorm": "model",
    "freeze_parameters": "model", "scale_lr": "model", "wrap_ddp": "model",
    "prepare_model": "model", "unwrap": "model",
    # data
    "make_train_loader": "data", "make_eval_loader": "data", "set_epoch": "data",
    "ShardSampler": "data", "ResumableDistributedSampler": "data", "IndexedDataset": "data",
    "default_num_workers": "data",
    # step loop pieces
    "Amp": "amp", "AMP_MODES": "amp", "choose_amp": "amp",
    "agree_step": "guard", "start_agreement": "guard", "StepAgreement": "guard",
    "NonFiniteError": "guard", "NonFiniteLossError": "guard", "NonFiniteWeightsError": "guard",
    "make_optimizer": "optim", "step_unless": "optim",
    "evaluate": "evaluation", "EvalResult": "evaluation",
    "progress": "display", "ScalarLogger": "display",
    "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint",
    "TrainState": "checkpoint", "atomic_save": "checkpoint",
    "Checkpointer": "asyncckpt", "newest_complete": "ckptstore", "CheckpointError": "ckptstore",
    "PreemptionHandler": "preempt", "Preempted": "preempt",
    "gather_results": "shards", "write_shard": "shards", "merge_shards": "shards",
    "train_one_epoch": "loop", "fit": "loop", "FitConfig": "loop", "FitResult": "loop",
    "run_main": "entry",
    # torch-free
    "heartbeat": "liveness", "phase": "liveness", "step": "liveness", "StepTimer": "liveness",
    "PREEMPTED_EXIT_CODE": "exitcodes",
    "NONFINITE_LOSS_EXIT_CODE": "exitcodes", "read_dist_env": "distenv", "DistEnv": "distenv",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'clusterddp.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"clusterddp.train.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # let type checkers and IDEs see the real names
    from clusterddp.train.amp import AMP_MODES, Amp, choose_amp
    from clusterddp.train.asyncckpt import Checkpointer
    from clusterddp.train.ckptstore import CheckpointError, newest_complete
    from clusterddp.train.checkpoint import TrainState, atomic_save, load_checkpoint, save_checkpoint
    from clusterddp.train.data import (IndexedDataset, ResumableDistributedSampler, ShardSampler,
                                       default_num_workers, make_eval_loader, make_train_loader,
                                       set_epoch)
    from clusterddp.train.dist import (DistContext, all_gather_objects, barrier, cleanup,
                                       current_context, get_rank, get_world_size,
                                       init_distributed, is_main_process, reduce_value,
                                       run_on_main)
    from clusterddp.train.distenv import DistEnv, read_dist_env
    from clusterddp.train.entry import run_main
    from clusterddp.train.evaluation import EvalResult, evaluate
    from clusterddp.train.exitcodes import NONFINITE_LOSS_EXIT_CODE, PREEMPTED_EXIT_CODE
    from clusterddp.train.guard import (NonFiniteError, NonFiniteLossError, NonFiniteWeightsError,
                                        StepAgreement, agree_step, start_agreement)
    from clusterddp.train.liveness import StepTimer, heartbeat, phase, step
    from clusterddp.train.loop import FitConfig, FitResult, fit, train_one_epoch
    from clusterddp.train.optim import make_optimizer, step_unless
    from clusterddp.train.model import (broadcast_parameters, convert_sync_batchnorm,
                                        freeze_parameters, prepare_model, scale_lr, unwrap,
                                        wrap_ddp)
    from clusterddp.train.preempt import Preempted, PreemptionHandler
    from clusterddp.train.display import ScalarLogger, progress
    from clusterddp.train.shards import gather_results, merge_shards, write_shard
