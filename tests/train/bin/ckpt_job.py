"""A tiny ``fit`` job for the checkpoint tests: async or sync checkpoints every N steps,
with faults injected at given steps (a full disk, a vanished directory, a sleep per step).

    python ckpt_job.py OUT --checkpoint-dir DIR [--checkpoint-every 2] [--mode async|sync]
        [--fill-disk-at K --free-disk-at M] [--remove-dir-at K] [--state-mb 8]

Run as N ranks with the torchrun env contract (or as one process). Rank 0 writes the final
parameters to OUT/params.pt. ``--state-mb`` adds a non-trainable buffer so that a write takes
long enough for training to run beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from clusterddp import train as T


def make_model(state_mb: int) -> nn.Module:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if state_mb:
        model.register_buffer("ballast", torch.randn(state_mb * 2 ** 18))
    return model


def fill(directory: Path) -> None:
    """Write a filler file until the filesystem is full (ENOSPC)."""
    block = b"\0" * (1 << 16)
    try:
        with open(directory / "filler", "wb") as f:
            while True:
                f.write(block)
                f.flush()
    except OSError:
        pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-every", default="2", help="steps, or auto")
    p.add_argument("--min-s", type=float, default=60.0)
    p.add_argument("--max-s", type=float, default=3600.0)
    p.add_argument("--fail-at", type=int, help="attempt 0 exits 1 at this step (a failure)")
    p.add_argument("--mode", default="async")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--state-mb", type=int, default=0)
    p.add_argument("--job-name")
    p.add_argument("--resume", default="auto")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--fill-disk-at", type=int)
    p.add_argument("--free-disk-at", type=int)
    p.add_argument("--remove-dir-at", type=int)
    args = p.parse_args()
    torch.set_num_threads(1)
    ctx = T.init_distributed()
    model = T.prepare_model(make_model(args.state_mb), ctx)
    optimizer = T.make_optimizer("sgd", model.parameters(), ctx.device, lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.size, 8, generator=g)
    data = TensorDataset(x, (x @ torch.randn(8, 4, generator=g)).argmax(dim=1))
    loader = T.make_train_loader(data, args.batch, ctx, num_workers=0, seed=3)
    base = nn.CrossEntropyLoss()
    directory = Path(args.checkpoint_dir)
    calls = 0

    def criterion(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if ctx.is_main:
            if calls == args.fill_disk_at:
                fill(directory)
            if calls == args.free_disk_at and (directory / "filler").exists():
                os.unlink(directory / "filler")
            if calls == args.remove_dir_at:  # at once (a rename), then away: the writer may be busy
                gone = directory.with_name(directory.name + ".gone")
                os.rename(directory, gone)
                shutil.rmtree(gone, ignore_errors=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if calls == args.fail_at and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            os._exit(1)
        return base(outputs, targets)

    config = T.FitConfig(epochs=args.epochs, checkpoint_dir=args.checkpoint_dir,
                         resume=None if args.resume == "none" else args.resume, progress=False,
                         checkpoint_every=(args.checkpoint_every if args.checkpoint_every == "auto"
                                           else int(args.checkpoint_every)),
                         checkpoint_min_s=args.min_s, checkpoint_max_s=args.max_s,
                         checkpoint_mode=args.mode,
                         job_name=args.job_name)
    T.fit(model, optimizer, loader, criterion, ctx, config)
    if ctx.is_main:
        torch.save({k: v.detach().cpu() for k, v in T.unwrap(model).state_dict().items()},
                   args.out / "params.pt")
        print(f"done after {calls} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    T.run_main(main)
