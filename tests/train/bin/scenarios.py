"""Tiny DDP programs for the clusterddp.train acceptance tests.

Run as ``python scenarios.py NAME OUT_DIR [options]`` in each of N processes given the
torchrun env contract (or none, for the single-process reference); the tests also import
the functions and call them in-process for references. Every scenario uses tiny models
and data made here, so a 2-process run costs about the price of importing torch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from clusterddp import train as T


def make_data(n: int, features: int = 8, classes: int = 4, seed: int = 0) -> TensorDataset:
    """A deterministic classification set: same tensors in every process."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    y = (x @ w + 0.5 * torch.randn(n, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def make_model(dropout: float = 0.0, seed: int = 1) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(8, 16), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(16, 4))
    return nn.Sequential(*layers)


def save_params(model: nn.Module, path: Path) -> None:
    torch.save({k: v.detach().cpu() for k, v in T.unwrap(model).state_dict().items()}, path)


def train(out: Path, batch: int, epochs: int, dropout: float = 0.0,
          resume: str | None = None, checkpoint_dir: str | None = None,
          kill_at_call: int | None = None, kill_rank: int = 1,
          nan_at_call: int | None = None, nan_rank: int = 1,
          fused: bool = False, amp: str = "off") -> None:
    """Train the tiny MLP with ``fit``; rank 0 saves the final parameters to out/params.pt.

    ``kill_at_call``: rank ``kill_rank`` sends itself SIGUSR1 during that loss computation
    (a real signal through the real handler, delivered to one rank only).
    ``nan_at_call``: rank ``nan_rank``'s loss becomes NaN at that call.
    ``fused``: fused SGD (its update is skipped in the kernel), else torch's default SGD
    (whose gradients are zeroed instead). When training stops on a NaN, each rank writes
    out/stopped.rankR.json: the error's steps, the loss calls made, and whether its weights
    and optimizer state in memory are still finite.
    """
    ctx = T.init_distributed()
    model = T.prepare_model(make_model(dropout), ctx)
    torch.manual_seed(100 + ctx.rank)  # ranks' dropout streams differ, as in real jobs
    optimizer = T.make_optimizer("sgd", model.parameters(), ctx.device, lr=0.1, momentum=0.9,
                                 fused=fused)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    loader = T.make_train_loader(make_data(64), batch, ctx, num_workers=0, seed=3)
    base = nn.CrossEntropyLoss()
    calls = 0

    def criterion(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        loss = base(outputs, targets)
        if kill_at_call == calls and ctx.rank == kill_rank:
            os.kill(os.getpid(), signal.SIGUSR1)
        if nan_at_call == calls and ctx.rank == nan_rank:
            loss = loss * float("nan")
        return loss

    config = T.FitConfig(epochs=epochs, checkpoint_dir=checkpoint_dir, resume=resume,
                         progress=False, amp=amp)
    try:
        T.fit(model, optimizer, loader, criterion, ctx, config, scheduler=scheduler)
    except T.NonFiniteLossError as exc:
        report_stop(out / f"stopped.rank{ctx.rank}.json", exc, calls, model, optimizer)
        raise
    if ctx.is_main:
        save_params(model, out / "params.pt")


def report_stop(path: Path, exc: T.NonFiniteLossError, calls: int, model: nn.Module,
                optimizer: torch.optim.Optimizer) -> None:
    """What a rank knew when it stopped on a NaN, for the tests to compare across ranks."""
    tensors = list(model.state_dict().values()) + [
        v for state in optimizer.state.values() for v in state.values()
        if isinstance(v, torch.Tensor)]
    path.write_text(json.dumps({
        "epoch": exc.epoch, "step": exc.step, "stopped_at": exc.stopped_at, "calls": calls,
        "finite": all(bool(torch.isfinite(t).all()) for t in tensors)}))


def evaluate_odd(out: Path, size: int) -> dict[str, int]:
    """Exact accuracy of a fixed random model on ``size`` samples; rank 0 writes eval.json."""
    ctx = T.init_distributed()
    model = T.prepare_model(make_model(), ctx)
    loader = T.make_eval_loader(make_data(size, seed=7), 8, ctx, num_workers=0)
    result = T.evaluate(model, loader, ctx)
    summary = {"correct": result.correct, "total": result.total}
    if ctx.is_main:
        (out / "eval.json").write_text(json.dumps(summary))
    return summary


def infer(out: Path, size: int) -> Path:
    """Predict every sample; per-rank shards merged into out/predictions.jsonl."""
    ctx = T.init_distributed()
    model = T.unwrap(T.prepare_model(make_model(), ctx)).eval()
    loader = T.make_eval_loader(T.IndexedDataset(make_data(size, seed=9)), 5, ctx, num_workers=0)
    records = []
    with torch.no_grad():
        for indices, (x, _) in loader:
            logits = model(x)
            for i, row in zip(indices.tolist(), logits):
                records.append({"index": i, "pred": int(row.argmax()), "score": float(row.max())})
    return T.gather_results(records, out / "shards", ctx, name="predictions",
                            merged_path=out / "predictions.jsonl", expected=size)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["train", "eval", "infer"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--resume")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--kill-at-call", type=int)
    parser.add_argument("--nan-at-call", type=int)
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--fused", action="store_true")
    parser.add_argument("--amp", default="off")
    parser.add_argument("--size", type=int, default=101)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.scenario == "train":
        train(args.out, args.batch, args.epochs, args.dropout, args.resume, args.checkpoint_dir,
              args.kill_at_call, kill_rank=args.kill_rank, nan_at_call=args.nan_at_call,
              fused=args.fused, amp=args.amp)
    elif args.scenario == "eval":
        evaluate_odd(args.out, args.size)
    else:
        infer(args.out, args.size)
    return 0


if __name__ == "__main__":
    T.run_main(main)
