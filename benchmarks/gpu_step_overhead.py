"""Per-step cost on one GPU: the seeds' loop, clusterddp.train, and a loop with no host sync.

    .venv/bin/python benchmarks/gpu_step_overhead.py [--rounds 5] [--steps 50] [--batch 256]
                                                     [--precisions fp32,bf16]

ResNet-18 with the CIFAR stem (torchvision's resnet18, 3x3 stride-1 conv1, no max-pool, 10
classes) on GPU-resident random batches (generated here, nothing is downloaded), one
process, as in issue 11's table. Three loops, each with its own copy of the model:

* seed-style: backward, ``reduce_value(loss)``, ``if not torch.isfinite(...)``, step: the
  check reads the loss on the host, so the CPU waits for backward every step;
* clusterddp.train: ``train_one_epoch`` (agreement read one step late, fused SGD, ``Amp``);
* no-sync: forward, backward, step and nothing else, with the same fused SGD: the floor.

Each round runs every loop for ``--steps`` steps, in an order that rotates between rounds
(so drift in clocks and temperature hits all alike), timed between ``torch.cuda.synchronize``
calls. Prints the median ms/step of each loop and its ratio to the no-sync loop's median,
and the median of per-round ratios. Target: clusterddp.train at most 1.03x the no-sync loop.
Without a CUDA device it says it skipped and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

LOOPS = ("seed-style", "clusterddp.train", "no-sync")
TARGET = 1.03


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=50, help="steps per loop per round")
    p.add_argument("--batch", type=int, nargs="+", default=[256])
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    p.add_argument("--lr", type=float, default=0.01)
    return p.parse_args()


def build_model(device: Any) -> Any:
    """torchvision ResNet-18 with the CIFAR stem, on ``device``, same weights every call."""
    import torch
    from torch import nn
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model.to(device).train()


def seed_style(model: Any, optimizer: Any, batches: list[Any], dtype: Any) -> None:
    """The seeds' step: backward, reduce_value, a host-side isfinite check, step."""
    import torch
    from torch import nn

    from clusterddp import train as T

    loss_fn = nn.CrossEntropyLoss()
    mean_loss = torch.zeros(1, device=batches[0][0].device)
    for step, (images, labels) in enumerate(batches):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(model(images), labels)
        loss.backward()
        reduced = T.reduce_value(loss.detach())
        mean_loss = (mean_loss * step + reduced) / (step + 1)
        if not torch.isfinite(reduced):  # the host sync
            sys.exit("non-finite loss")
        optimizer.step()
        optimizer.zero_grad()


def no_sync(model: Any, optimizer: Any, batches: list[Any], dtype: Any) -> None:
    """The floor: nothing but forward, backward and the optimizer step."""
    import torch
    from torch import nn

    loss_fn = nn.CrossEntropyLoss()
    for images, labels in batches:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()


def make_runs(batch: int, precision: str, args: argparse.Namespace,
              handler: Any) -> dict[str, Callable[[int], None]]:
    """One epoch of each loop as a function of the round number, models and data built here."""
    import torch
    from torch import nn

    from clusterddp import train as T

    ctx = T.init_distributed()
    dtype = {"fp32": None, "bf16": torch.bfloat16}[precision]
    g = torch.Generator(device=ctx.device).manual_seed(0)
    batches = [(torch.randn(batch, 3, 32, 32, device=ctx.device, generator=g),
                torch.randint(0, 10, (batch,), device=ctx.device, generator=g))
               for _ in range(args.steps)]
    models = {name: build_model(ctx.device) for name in LOOPS}
    hyper = {"lr": args.lr, "momentum": 0.9, "weight_decay": 5e-4}
    seed_opt = torch.optim.SGD(models["seed-style"].parameters(), **hyper)
    ours_opt = T.make_optimizer("sgd", models["clusterddp.train"].parameters(), ctx.device,
                                **hyper)
    floor_opt = T.make_optimizer("sgd", models["no-sync"].parameters(), ctx.device, **hyper)
    amp = T.Amp(ctx.device, "off" if dtype is None else precision)
    loss_fn = nn.CrossEntropyLoss()
    return {
        "seed-style": lambda r: seed_style(models["seed-style"], seed_opt, batches, dtype),
        "clusterddp.train": lambda r: T.train_one_epoch(
            models["clusterddp.train"], batches, ours_opt, loss_fn, ctx,  # type: ignore[arg-type]
            epoch=r, amp=amp, preemption=handler, show_progress=False),
        "no-sync": lambda r: no_sync(models["no-sync"], floor_opt, batches, dtype),
    }


def measure(batch: int, precision: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """ms/step of each loop, one value per round; rounds rotate the loops' order."""
    import torch

    from clusterddp import train as T

    times: dict[str, list[float]] = {name: [] for name in LOOPS}
    with T.PreemptionHandler() as handler:
        runs = make_runs(batch, precision, args, handler)
        for name in LOOPS:  # warm-up: cuDNN autotuning, allocator, lazy inits
            runs[name](0)
        for r in range(args.rounds):
            for name in LOOPS[r % 3:] + LOOPS[:r % 3]:
                torch.cuda.synchronize()
                start = time.perf_counter()
                runs[name](r + 1)
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    del runs
    torch.cuda.empty_cache()
    return times


def report(batch: int, precision: str, times: dict[str, list[float]]) -> bool:
    """One table row; True when clusterddp.train meets the target."""
    floor = statistics.median(times["no-sync"])
    cells = []
    for name in LOOPS[:2]:
        median = statistics.median(times[name])
        paired = statistics.median(t / f for t, f in zip(times[name], times["no-sync"]))
        cells.append(f"{median:7.2f} ({median / floor:.3f}x, paired {paired:.3f}x)")
    ours = statistics.median(times["clusterddp.train"]) / floor
    met = ours <= TARGET
    print(f"| {batch}, {precision} | {cells[0]} | {cells[1]} | {floor:7.2f} | "
          f"{'met' if met else 'NOT met'} |", flush=True)
    return met


def main() -> int:
    args = parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_step_overhead: skipped: no CUDA device here (torch.cuda.is_available() is "
              "False); run it on a GPU node", flush=True)
        return 0
    torch.backends.cudnn.benchmark = True
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    print(f"{torch.cuda.get_device_name()} (torch {torch.__version__}), ResNet-18 CIFAR stem, "
          f"one process, GPU-resident data; median ms/step of {args.rounds} interleaved rounds "
          f"x {args.steps} steps; ratio to the no-sync loop (target clusterddp.train <= "
          f"{TARGET}x)", flush=True)
    print("| batch, precision | seed-style (foreach SGD) | clusterddp.train (fused SGD) | "
          "no-sync (fused SGD) | target |")
    print("|---|---|---|---|---|")
    met = [report(b, p, measure(b, p, args)) for p in precisions for b in args.batch]
    print(f"target met in {sum(met)} of {len(met)} configuration(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
