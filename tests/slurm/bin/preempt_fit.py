"""The example job's model, data and recipe trained with ``clusterddp.train.fit``, slowed down.

jobs/cifar10.py's ResNet (``--width``), generated stand-in data and optimizer recipe (SGD with
Nesterov momentum and weight decay, cosine schedule per epoch), with ``fit`` doing the rest:
the SIGUSR1 handler, the agreed stop at a step boundary, the checkpoint, exit 75 through
``run_main``, and ``resume="auto"`` from ``checkpoint_dir/last.pt`` when SLURM runs the job
again. Two things are added for the SLURM preemption test, which jobs/cifar10.py rightly
does not have: ``--step-sleep`` so the signal lands mid-training, and ``--progress-file``,
where rank 0 writes how many steps this run has started, so the test knows when to signal.

DDP gets ``find_unused_parameters=True``, not because any parameter is unused but because it
is the one DDP setting that keeps the gradient bucket order fixed: otherwise DDP rebuilds
its buckets in gradient-ready order after the first step of every process, so the first
step after a resume all-reduces with each parameter at another offset of the flat bucket.
With more than two ranks, gloo's ring all-reduce then adds the ranks' values in another
order for those elements, and the resumed run ends a few ulps away from the uninterrupted
one (with two ranks a + b == b + a, which is why 2-rank tests do not see it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

import torch
from torch import nn

from clusterddp import train as T

CIFAR10 = Path(__file__).resolve().parents[3] / "jobs" / "cifar10.py"


def load_example() -> object:
    """jobs/cifar10.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("cifar10_example", CIFAR10)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--train-size", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step")
    parser.add_argument("--progress-file", type=Path)
    args = parser.parse_args()
    example = load_example()
    ctx = T.init_distributed()
    if ctx.is_main:
        print(f"preempt_fit: start with SLURM_RESTART_COUNT="
              f"{os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
    torch.manual_seed(0)
    model = T.prepare_model(example.build_model(args.width), ctx,  # type: ignore[attr-defined]
                            find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4,
                                nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    train_set = example.synthetic_cifar(args.train_size, seed=1)  # type: ignore[attr-defined]
    loader = T.make_train_loader(train_set, args.batch_size, ctx, seed=0, num_workers=0)
    base = nn.CrossEntropyLoss()
    started = 0

    def criterion(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        nonlocal started
        started += 1
        if ctx.is_main and args.progress_file is not None:
            args.progress_file.write_text(str(started))
        time.sleep(args.step_sleep)
        return base(outputs, targets)

    config = T.FitConfig(epochs=args.epochs, checkpoint_dir=args.checkpoint_dir, resume="auto",
                         progress=False)
    T.fit(model, optimizer, loader, criterion, ctx, config, scheduler=scheduler)
    return 0


if __name__ == "__main__":
    T.run_main(main)
