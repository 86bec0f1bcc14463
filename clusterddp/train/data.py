"""Data loaders for DDP: each rank a disjoint slice, reproducible per epoch, resumable.

Training uses ``DistributedSampler`` (shuffled, padded to equal length so every rank runs
the same number of steps and no collective waits for a rank that ran out of data).
Evaluation and inference must NOT use it: its padding repeats samples, and the seeds'
accuracy counted those repeats. ``ShardSampler`` splits without padding; ranks may then
differ by one sample, which is fine because no collective runs per batch there.
"""

from __future__ import annotations

import math
import os
import signal
import typing
from typing import Any, Callable, Iterator, Sized

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from clusterddp.train.dist import DistContext


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can start an epoch part-way, for mid-epoch resume.

    ``set_epoch(epoch, skip=n)`` drops this rank's first ``n`` samples of that epoch; the
    order of the rest is exactly what an uninterrupted epoch would have produced, because
    the shuffle depends only on ``seed + epoch``.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0) -> None:
        super().__init__(typing.cast(Any, dataset), num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=False)
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:  # type: ignore[override]
        """Select the epoch's permutation; ``skip`` samples are left out at its start."""
        super().set_epoch(epoch)
        if not 0 <= skip <= self.num_samples:
            raise ValueError(f"cannot skip {skip} of {self.num_samples} samples")
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.skip:])

    def __len__(self) -> int:
        return self.num_samples - self.skip


class ShardSampler(Sampler[int]):
    """Rank r gets indices r, r+W, r+2W, ... of the data set: no padding, no repeats.

    The union over ranks is every index exactly once, which is what exact evaluation and
    mergeable inference need.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside 0..{num_replicas - 1}")
        self.size = len(dataset)
        self.num_replicas = num_replicas
        self.rank = rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.size, self.num_replicas))

    def __len__(self) -> int:
        return max(0, math.ceil((self.size - self.rank) / self.num_replicas))


class IndexedDataset(Dataset):
    """Yields ``(index, item)``: lets each rank say which rows its results belong to."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return index, self.dataset[index]


def default_num_workers(local_world_size: int) -> int:
    """Loader processes per rank: this machine's usable cores shared among its ranks.

    One core per rank is left to the training process itself; capped at 8, past which
    workers mostly add memory. The seeds used ``min(cpu_count, batch_size, 8)`` per rank,
    which on an 8-GPU node starts 64 processes fighting for the same cores.
    """
    try:
        mine = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(0, min(8, (os.cpu_count() or 1) // max(1, local_world_size) - 1))
    share = mine if mine < _parents_cpus(mine) else mine // max(1, local_world_size)
    return max(0, min(8, share - 1))


def _parents_cpus(default: int) -> int:
    """How many CPUs the process that started this rank may use. A rank bound to fewer than
    its launcher (clusterddp's ``cpu_affinity``, a torchrun ``--numa-binding``) already has
    its share: dividing it among the node's ranks again would leave loaders idle cores."""
    try:
        return len(os.sched_getaffinity(os.getppid()))
    except OSError:  # the parent is gone, or not ours to ask: take the rank's own set as the node's
        return default


#: Signals a scheduler sends as a warning (preemption, time limit). A loader process takes
#: none of them: SLURM delivers them to every process of the step, the loader processes
#: included, and their default action would kill them under the trainer, which then fails
#: on its next batch instead of finishing the step and writing its checkpoint. They end with
#: the trainer (torch stops them, and its watchdog ends them when their parent is gone).
LOADER_IGNORED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


def ignore_warning_signals(worker_id: int) -> None:
    """``worker_init_fn`` of the loaders built here: see LOADER_IGNORED_SIGNALS."""
    for sig in LOADER_IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _loader(dataset: Dataset, sampler: Sampler[int], batch_size: int, ctx: DistContext,
            drop_last: bool, num_workers: int | None, persistent_workers: bool,
            collate_fn: Callable[[list[Any]], Any] | None, seed: int) -> DataLoader:
    workers = default_num_workers(ctx.local_world_size) if num_workers is None else num_workers
    generator = torch.Generator()
    # The loader draws its workers' base seed from this generator, not from the global RNG,
    # so creating an iterator does not shift the RNG that dropout uses (exact resume).
    generator.manual_seed(_epoch_seed(seed, 0, ctx.rank))
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                      num_workers=workers, pin_memory=ctx.device.type == "cuda",
                      persistent_workers=persistent_workers and workers > 0,
                      collate_fn=collate_fn, generator=generator,
                      worker_init_fn=ignore_warning_signals if workers > 0 else None)


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return ((seed * 1_000_003 + epoch) * 1_009 + rank) % (2 ** 63)


def make_train_loader(dataset: Dataset, batch_size: int, ctx: DistContext, *,
                      shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                      num_workers: int | None = None, persistent_workers: bool = False,
                      collate_fn: Callable[[list[Any]], Any] | None = None) -> DataLoader:
    """Training loader: ``batch_size`` per rank, this rank's shuffled slice of each epoch.

    ``drop_last`` drops a final short batch, so every step of every rank has the same
    batch size (DDP's mean of per-rank means is then the global mean). ``pin_memory`` is on
    only with CUDA: without a GPU it costs a copy and warns. Call ``set_epoch`` before each
    epoch, or every epoch repeats the first one's order.
    """
    sampler = ResumableDistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,  # type: ignore[arg-type]
                                          shuffle=shuffle, seed=seed)
    return _loader(dataset, sampler, batch_size, ctx, drop_last, num_workers,
                   persistent_workers, collate_fn, seed)


def make_eval_loader(dataset: Dataset, batch_size: int, ctx: DistContext, *,
                     num_workers: int | None = None, persistent_workers: bool = False,
                     collate_fn: Callable[[list[Any]], Any] | None = None) -> DataLoader:
    """Evaluation/inference loader: this rank's unpadded shard, in data-set order."""
    sampler = ShardSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank)  # type: ignore[arg-type]
    return _loader(dataset, sampler, batch_size, ctx, False, num_workers, persistent_workers,
                   collate_fn, 0)


def set_epoch(loader: DataLoader, epoch: int, skip_batches: int = 0) -> None:
    """Start ``epoch``: new shuffle, fresh worker seeds, optionally skipping batches (resume).

    Worker seeds depend on (seed, epoch, rank) only, so random augmentations in loader
    workers repeat exactly when an epoch is rerun from its start.
    """
    sampler = loader.sampler
    if isinstance(sampler, ResumableDistributedSampler):
        sampler.set_epoch(epoch, skip=skip_batches * (loader.batch_size or 1))
        seed, rank = sampler.seed, sampler.rank
    elif isinstance(sampler, DistributedSampler):
        if skip_batches:
            raise ValueError("skipping batches needs a ResumableDistributedSampler "
                             "(make_train_loader builds one)")
        sampler.set_epoch(epoch)
        seed, rank = sampler.seed, sampler.rank
    else:
        raise TypeError(f"loader's sampler is {type(sampler).__name__}, not a distributed "
                        "sampler; build the loader with make_train_loader")
    if loader.generator is not None:
        loader.generator.manual_seed(_epoch_seed(seed, epoch, rank))
