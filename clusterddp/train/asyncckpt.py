"""Checkpoints written in the background while training goes on (``fit``'s checkpointer).

A save has two parts. **Staging**, on the training thread while every rank waits: the RNG
gather (``checkpoint.save_checkpoint``'s), then rank 0 copies the state into CPU buffers of
its own (reused from one save to the next: no allocation, no page faults; on CUDA pinned,
copied with ``non_blocking`` and one synchronize). That copy is the training stall.
**Writing**, on one background thread of rank 0: the finite check of the copy (a state with
a NaN or an infinity is never written; every rank raises ``NonFiniteWeightsError`` at the
next save or at the end of training; DDP's state is the same on every rank, so rank 0's
copy stands for all), ``torch.save``, fsync, read back for sizes and sha256, the manifest,
``last.pt``, pruning (``ckptstore.publish``). The check is off the training thread because
it reads the whole state once more: in the stall it cost as much as the copy.

A thread, not a process: the state is already a private copy, so a thread writes it with no
second copy to another process's shared memory and no process to start (PyTorch DCP's
process mode pays both, see ``benchmarks/checkpoint_stall.py``); the write is file I/O and
hashing, which release the GIL. DDP's state is the same on every rank, so it is written
whole, once, by rank 0 (not sharded): any world size can load it, and a kill of another
rank cannot tear it. The writer runs no collective, so it cannot deadlock against training.

At most one save is in flight: a save that finds the previous one still writing says so
once and waits for it (its staging buffers are still being read). A background write that
fails (disk full, directory gone) prints one line and training goes on; the previous
checkpoint stays the newest. ``wait=True`` (preemption, the end of training, sync mode)
waits for the write and makes every rank raise if rank 0's failed, as the synchronous save
always did.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clusterddp.train.amp import Amp
from clusterddp.train.checkpoint import FORMAT_VERSION, TrainState, capture_rng
from clusterddp.train.ckptstore import (CheckpointError, DirLock, Manifest, newest_complete,
                                        next_seq, publish, say)
from clusterddp.train.dist import DistContext, all_gather_objects
from clusterddp.train.guard import NonFiniteWeightsError, all_finite
from clusterddp.train.liveness import phase
from clusterddp.train.model import unwrap


def _tree_tensors(*trees: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for tree in trees:
        if isinstance(tree, torch.Tensor):
            found.append(tree)
        elif isinstance(tree, dict):
            found.extend(_tree_tensors(*tree.values()))
        elif isinstance(tree, (list, tuple)):
            found.extend(_tree_tensors(*tree))
    return found


class Stager:
    """Copies a state tree into CPU buffers kept between saves (same paths, same shapes)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._cuda = False

    def stage(self, tree: Any) -> Any:
        self._cuda = False
        staged = self._copy(tree, "")
        if self._cuda:
            torch.cuda.synchronize()
        return staged

    def _copy(self, value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value.detach(), path)
        if isinstance(value, dict):
            return {k: self._copy(v, f"{path}/{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self._copy(v, f"{path}/{i}") for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor, path: str) -> torch.Tensor:
        buffer = self._buffers.get(path)
        if (buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype
                or buffer.layout != tensor.layout or not tensor.is_contiguous()):
            pinned = tensor.is_cuda and torch.cuda.is_available()
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
            if tensor.is_contiguous():
                self._buffers[path] = buffer
        self._cuda = self._cuda or tensor.is_cuda
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        return buffer


class Checkpointer:
    """``fit``'s checkpoints in ``directory``: staged on the training thread, written by one
    background thread of rank 0 (``mode="async"``) or before ``save`` returns (``"sync"``).
    Every rank builds one and calls ``save`` at the same points."""

    def __init__(self, directory: str | Path, ctx: DistContext, *, mode: str = "async",
                 keep: int = 2, job: str | None = None) -> None:
        if mode not in ("async", "sync"):
            raise ValueError(f"checkpoint mode {mode!r}: expected 'async' or 'sync'")
        self.directory = Path(directory)
        self.ctx = ctx
        self.mode = mode
        self.keep = keep
        self.job = job
        self.saved: list[Manifest] = []      # published by this process (rank 0)
        self.failures: list[str] = []
        self._stager = Stager()
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._warned_slow = False
        self._refused: str | None = None     # a staged state that was not finite
        self._lock = DirLock(self.directory)
        self._seq = 0
        refused: str | None = None
        if ctx.is_main:
            try:
                self._lock.acquire()
                self._seq = next_seq(self.directory)
            except CheckpointError as exc:
                refused = str(exc)
        refused = all_gather_objects(refused)[0]  # every rank stops, none waits in a collective
        if refused:
            raise CheckpointError(refused)

    # -- the training thread --------------------------------------------------------------

    def save(self, *, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
             scheduler: Any = None, amp: Amp | None = None, state: TrainState,
             extra: dict[str, Any] | None = None, wait: bool = False) -> Path | None:
        """Stage this state and write it (in the background unless ``wait`` or sync mode).
        Returns the state file's path on rank 0 (published only once the write ends)."""
        path = self._stage_and_submit(model, optimizer, scheduler, amp, state, extra)
        if wait or self.mode == "sync":
            self.wait(raise_on_failure=True)
        return path

    @phase("checkpoint")  # the launcher's record: only this part stalls training
    def _stage_and_submit(self, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                          scheduler: Any, amp: Amp | None, state: TrainState,
                          extra: dict[str, Any] | None) -> Path | None:
        began = time.perf_counter()
        if self.ctx.is_main:
            self._wait_previous()
        # Rank 0's writer checked the previous save's state off the training thread; its
        # verdict travels with the RNG states, so every rank raises together.
        gathered = all_gather_objects((capture_rng(), self._refused))
        if gathered[0][1] is not None:
            raise NonFiniteWeightsError(gathered[0][1], [0])
        if not self.ctx.is_main:
            return None
        payload = self._stager.stage({
            "format": FORMAT_VERSION,
            "model": unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": amp.state_dict() if amp is not None else None,
            "train_state": asdict(state),
            "world_size": self.ctx.world_size,
            "rng": [rng for rng, _ in gathered],
            "extra": extra or {},
        })
        seq, self._seq = self._seq, self._seq + 1
        manifest = Manifest(seq=seq, files={}, job=self.job, world_size=self.ctx.world_size,
                            epoch=state.epoch, step=state.step, global_step=state.global_step,
                            stall_s=round(time.perf_counter() - began, 6))
        self._error = None
        self._thread = threading.Thread(target=self._write, args=(payload, manifest),
                                        name=f"clusterddp-ckpt-{seq}", daemon=True)
        self._thread.start()
        return self.directory / manifest.state_file

    def _wait_previous(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        if not self._warned_slow:
            self._warned_slow = True
            say(f"checkpoint writer cannot keep up: a save is due while the previous one is "
                f"still writing to {self.directory}; waiting for it (said once)")
        self._thread.join()

    def wait(self, raise_on_failure: bool = False) -> None:
        """Wait for the save in flight. With ``raise_on_failure`` every rank learns whether
        rank 0's write worked and raises if not (a collective: every rank calls it)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if raise_on_failure:
            error, refused = all_gather_objects((self._error, self._refused) if self.ctx.is_main
                                                else (None, None))[0]
            if refused:
                raise NonFiniteWeightsError(refused, [0])
            if error:
                raise RuntimeError(f"rank 0 failed while writing a checkpoint: {error}")

    def close(self) -> None:
        """Wait for the save in flight (a save at the end of training is not lost), unlock."""
        self.wait()
        self._lock.release()

    # -- the writer thread ----------------------------------------------------------------

    def _write(self, payload: dict[str, Any], manifest: Manifest) -> None:
        began = time.perf_counter()
        if not all_finite(_tree_tensors(payload["model"], payload["optimizer"])):
            self._refused = str(self.directory / manifest.state_file)
            say(f"refusing checkpoint {manifest.state_file}: its weights or optimizer state hold "
                "NaN or infinite values; nothing written, every rank stops at the next save")
            return
        try:
            done = publish(self.directory, manifest, lambda f: torch.save(payload, f), self.keep)
            done = Manifest(**{**done.__dict__, "write_s": round(time.perf_counter() - began, 6)})
            self.saved.append(done)
        except Exception as exc:  # reported once; training goes on with the older checkpoint
            self._error = f"{type(exc).__name__}: {exc}"
            self.failures.append(self._error)
            scan = newest_complete(self.directory, job=self.job) if self.directory.is_dir() else None
            older = scan.newest[0].name if scan is not None and scan.newest else "none"
            say(f"checkpoint {manifest.state_file} failed, training goes on: {self._error}; "
                f"the newest complete checkpoint is still {older}")
