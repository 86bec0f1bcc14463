"""ResNet-18 on CIFAR-10 with clusterddp.train: the example training job (jobs/cifar10.yaml).

Runs unchanged as ``python jobs/cifar10.py`` (one process), under ``clusterddp run
jobs/cifar10.yaml``, torchrun, ``torch.distributed.launch`` or ``srun``. CIFAR-10 is read
from ``--data-dir`` when it holds torchvision's ``cifar-10-batches-py``; nothing is ever
downloaded. Without it the job trains on a generated stand-in (class-dependent patterns
plus noise, the same on every rank and every run) and says so, so the job also runs on
machines without the data set or a network.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from clusterddp import train as T

CIFAR_DIR = "cifar-10-batches-py"
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


class CifarResNet(nn.Module):
    """torchvision's ResNet-18 (its ``BasicBlock``, layers [2, 2, 2, 2]) adapted to 32x32.

    The ImageNet stem (7x7 stride-2 conv and max-pool) would shrink a 32x32 image to 8x8
    before the first block; CIFAR ResNets use a 3x3 stride-1 conv and no pool. ``width``
    is the first stage's channel count (64 in the original); smaller widths make a CPU
    demo fast.
    """

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        from torchvision.models.resnet import BasicBlock

        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages = []
        inplanes = width
        for i, blocks in enumerate((2, 2, 2, 2)):
            planes = width * 2 ** i
            stride = 1 if i == 0 else 2
            downsample = None
            if stride != 1 or inplanes != planes:
                downsample = nn.Sequential(
                    nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes))
            layers = [BasicBlock(inplanes, planes, stride, downsample)]
            layers += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layers))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model(width: int) -> nn.Module:
    """ResNet-18 for 32x32 inputs; width 64 is exactly torchvision's resnet18 with a CIFAR stem."""
    if width == 64:
        from torchvision.models import resnet18

        model = resnet18(num_classes=10)
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
        return model
    return CifarResNet(num_classes=10, width=width)


def synthetic_cifar(size: int, seed: int) -> TensorDataset:
    """A learnable stand-in: each class is a smooth random pattern, images add noise.

    Deterministic in (size, seed), so every rank builds the same set without talking.
    """
    g = torch.Generator().manual_seed(1234)  # class patterns shared by train and test
    patterns = nn.functional.interpolate(torch.randn(10, 3, 4, 4, generator=g), size=32,
                                         mode="bilinear", align_corners=False)
    g.manual_seed(seed)
    labels = torch.randint(0, 10, (size,), generator=g)
    images = patterns[labels] + 1.5 * torch.randn(size, 3, 32, 32, generator=g)
    return TensorDataset(images, labels)


def load_data(args: argparse.Namespace) -> tuple[Dataset, Dataset, str]:
    """(train, test, a sentence saying which data this is)."""
    root = Path(args.data_dir)
    if (root / CIFAR_DIR).is_dir():
        from torchvision import datasets, transforms

        normalize = transforms.Normalize(MEAN, STD)
        train_tf = transforms.Compose([transforms.RandomCrop(32, padding=4),
                                       transforms.RandomHorizontalFlip(),
                                       transforms.ToTensor(), normalize])
        test_tf = transforms.Compose([transforms.ToTensor(), normalize])
        train = datasets.CIFAR10(str(root), train=True, transform=train_tf, download=False)
        test = datasets.CIFAR10(str(root), train=False, transform=test_tf, download=False)
        return train, test, f"CIFAR-10 from {root} ({len(train)} train, {len(test)} test images)"
    train = synthetic_cifar(args.synthetic_train, seed=1)
    test = synthetic_cifar(args.synthetic_test, seed=2)
    sizes = " / ".join(f"{len(d)} {what}" for d, what in ((train, "train"), (test, "test")) if len(d))
    return train, test, (
        f"CIFAR-10 not found in {root} (expected {root / CIFAR_DIR}; nothing is downloaded): "
        f"using a generated stand-in of {sizes} images")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default="data/cifar10", help="holds cifar-10-batches-py")
    p.add_argument("--out-dir", default="runs/cifar10",
                   help="checkpoints in OUT/checkpoints, TensorBoard events in OUT/tensorboard")
    p.add_argument("--checkpoint-dir", help="default OUT/checkpoints")
    p.add_argument("--tensorboard-dir", help="default OUT/tensorboard")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--eval-batch-size", type=int, default=256, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--scale-lr", choices=["none", "linear", "sqrt"], default="none",
                   help="scale --lr by the number of ranks (off by default)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--width", type=int, default=64, help="first-stage channels (64 = ResNet-18)")
    p.add_argument("--syncbn", action="store_true", help="SyncBatchNorm across ranks (GPUs)")
    p.add_argument("--amp", nargs="?", const="auto", default="off", choices=T.AMP_MODES,
                   help="mixed precision: bf16 (no scaler; GPUs of compute capability 8.0+, "
                        "CPUs), fp16 (GradScaler; older GPUs), auto (the best the device has; "
                        "a bare --amp means auto), off")
    p.add_argument("--freeze", action="append", default=[], metavar="GLOB",
                   help="freeze parameters matching GLOB, e.g. 'layer1.*' (repeatable)")
    p.add_argument("--keep", action="append", default=[], metavar="GLOB",
                   help="...except those matching GLOB, e.g. --freeze '*' --keep 'fc.*'")
    p.add_argument("--resume", default="auto",
                   help="checkpoint path, 'auto' (the newest complete checkpoint in "
                        "OUT/checkpoints, if any) or 'none'")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="also checkpoint every STEPS steps (default: at epoch ends only)")
    p.add_argument("--checkpoint-mode", choices=["async", "sync"], default="async",
                   help="async: written in the background while training goes on (default); "
                        "sync: training waits for the write")
    p.add_argument("--workers", type=int, default=None, help="loader processes per rank")
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--synthetic-train", type=int, default=1024)
    p.add_argument("--synthetic-test", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preempt-signal", action="append", default=None, metavar="SIG",
                   help="signals that mean 'checkpoint and exit 75' (default SIGUSR1, SIGTERM)")
    p.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                   help="rank-0 progress bar (auto: only on a terminal)")
    # torch.distributed.launch passes this; init_distributed reads it from sys.argv.
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    ctx = T.init_distributed()
    out = Path(args.out_dir)
    checkpoint_dir = args.checkpoint_dir or str(out / "checkpoints")
    tensorboard_dir = args.tensorboard_dir or str(out / "tensorboard")
    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP broadcasts anyway)
    train_set, test_set, origin = load_data(args)
    if ctx.is_main:
        print(f"{origin}; {ctx.world_size} rank(s) on {ctx.device}, backend "
              f"{ctx.backend or 'none'}, amp {T.choose_amp(args.amp, ctx.device)}", flush=True)
    model = T.prepare_model(build_model(args.width), ctx, sync_bn=args.syncbn,
                            freeze=args.freeze, keep=args.keep)
    lr = T.scale_lr(args.lr, ctx.world_size, args.scale_lr)
    # Fused on CUDA: one kernel per step, and a NaN step is skipped inside it (guard.py).
    optimizer = T.make_optimizer("sgd", [p for p in model.parameters() if p.requires_grad],
                                 ctx.device, lr=lr, momentum=args.momentum,
                                 weight_decay=args.weight_decay, nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.epochs))
    train_loader = T.make_train_loader(train_set, args.batch_size, ctx, seed=args.seed,
                                       num_workers=args.workers,
                                       persistent_workers=args.persistent_workers)
    test_loader = T.make_eval_loader(test_set, args.eval_batch_size, ctx,
                                     num_workers=args.workers)
    config = T.FitConfig(epochs=args.epochs, checkpoint_dir=checkpoint_dir,
                         resume=None if args.resume == "none" else args.resume,
                         tensorboard_dir=tensorboard_dir, amp=args.amp,
                         progress={"auto": None, "on": True, "off": False}[args.progress],
                         preempt_signals=args.preempt_signal or T.FitConfig.preempt_signals,
                         checkpoint_every=args.checkpoint_every,
                         checkpoint_mode=args.checkpoint_mode)
    result = T.fit(model, optimizer, train_loader, nn.CrossEntropyLoss(), ctx, config,
                   eval_loader=test_loader, scheduler=scheduler)
    if ctx.is_main:
        if not result.history:
            print(f"nothing to do: {checkpoint_dir} already holds all {args.epochs} epochs "
                  "(use --resume none or another --out-dir to train again)")
        else:
            print(f"done: checkpoint {checkpoint_dir}/last.pt, TensorBoard {tensorboard_dir}")
    return 0


if __name__ == "__main__":
    T.run_main(main)
