"""Checkpoints written in the background while training goes on (``fit``'s checkpointer).

A save has two parts. **Staging**, while every rank waits: the RNG gather
(``checkpoint.save_checkpoint``'s), then rank 0 takes a copy of the state into CPU buffers
of its own, reused from one save to the next (no allocation, no page faults). Buffers and
small tensors are copied at once; the parameters and the optimizer's state, which only
``optimizer.step`` changes, are copied by the writer thread while the next forward and
backward run, and a step pre-hook on the optimizer makes the next ``step`` wait until that
copy is done (``defer_copy``; on CUDA every copy is queued on the current stream with
``non_blocking`` instead, so stream order protects it and the host waits for nothing). What
training loses is the gather, the small copies, and the part of the big copy that the next
forward and backward did not cover. **Writing**, on the same background thread: the finite
check of the copy (a state with a NaN or an infinity is never written; every rank raises
``NonFiniteWeightsError`` at the next save or at the end of training; DDP's state is the
same on every rank, so rank 0's copy stands for all), ``torch.save``, fsync, read back for
sizes and sha256, the manifest, ``last.pt``, pruning (``ckptstore.publish``). The check is
off the training thread because it reads the whole state once more.

Deferring the copy assumes nothing but ``optimizer.step`` changes the parameters between a
save and the next step (true of ``fit``; a hand-written loop that clips or averages weights
in place right after saving should pass ``defer_copy=False``).

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


#: Tensors at least this large may be copied behind the next forward/backward (``defer``).
DEFER_BYTES = 1 << 16


class Stager:
    """Copies a state tree into CPU buffers kept between saves (same paths, same shapes).

    ``stage(tree, defer=ids)``: CPU tensors whose storage is in ``defer`` (parameters and
    optimizer state: only ``optimizer.step`` changes them) and that are large are not copied
    here but listed in ``pending``, for the writer thread to copy while the next forward and
    backward run (``copy_pending``); everything else is copied at once. CUDA tensors are all
    copied here with ``non_blocking``: the copies are queued on the current stream, ahead of
    anything later that could change the tensors, and the host does not wait for them; the
    writer waits on ``ready`` before reading the buffers.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._cuda = False
        self._defer: set[int] = set()
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.ready: Any = None  # a CUDA event after the copies; None on CPU

    def stage(self, tree: Any, defer: set[int] | None = None) -> Any:
        self._cuda = False
        self._defer = defer or set()
        self.pending = []
        self.ready = None
        staged = self._copy(tree, "")
        if self._cuda:
            self.ready = torch.cuda.Event()
            self.ready.record()
        return staged

    def copy_pending(self) -> None:
        """The deferred copies (the writer thread; ATen's copy releases the GIL)."""
        for source, buffer in self.pending:
            buffer.copy_(source)
        self.pending = []
        if self.ready is not None:
            self.ready.synchronize()

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
        if tensor.is_cuda:
            self._cuda = True
            buffer.copy_(tensor, non_blocking=True)
        elif (tensor.untyped_storage().data_ptr() in self._defer
              and tensor.numel() * tensor.element_size() >= DEFER_BYTES):
            self.pending.append((tensor, buffer))
        else:
            buffer.copy_(tensor)
        return buffer


class Checkpointer:
    """``fit``'s checkpoints in ``directory``: staged on the training thread, written by one
    background thread of rank 0 (``mode="async"``) or before ``save`` returns (``"sync"``).
    Every rank builds one and calls ``save`` at the same points."""

    def __init__(self, directory: str | Path, ctx: DistContext, *, mode: str = "async",
                 keep: int = 2, job: str | None = None, defer_copy: bool = True) -> None:
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
        self.defer_copy = defer_copy and mode == "async"
        self._staged = threading.Event()     # the deferred copies are done
        self._staged.set()
        self._hooked: dict[int, Any] = {}    # optimizer id -> its step pre-hook's handle
        #: Seconds optimizer.step waited for deferred copies, over this checkpointer's life.
        self.fence_wait_s = 0.0
        self._fenced = 0.0
        #: Each save's training stall (staging; the deferred copy's wait joins the next one).
        self.stalls: list[float] = []
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
        defer: set[int] = set()
        if self.defer_copy and optimizer is not None:
            # Only optimizer.step changes these: their copy may wait until just before it.
            self._fence(optimizer)
            defer = {p.untyped_storage().data_ptr() for p in unwrap(model).parameters()}
            defer |= {t.untyped_storage().data_ptr() for state in optimizer.state.values()
                      for t in state.values() if isinstance(t, torch.Tensor)}
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
        }, defer)
        self.stalls.append(time.perf_counter() - began + self.fence_wait_s - self._fenced)
        self._fenced = self.fence_wait_s
        seq, self._seq = self._seq, self._seq + 1
        manifest = Manifest(seq=seq, files={}, job=self.job, world_size=self.ctx.world_size,
                            epoch=state.epoch, step=state.step, global_step=state.global_step,
                            stall_s=round(time.perf_counter() - began, 6))
        self._error = None
        if self._stager.pending:
            self._staged.clear()
        self._thread = threading.Thread(target=self._write, args=(payload, manifest),
                                        name=f"clusterddp-ckpt-{seq}", daemon=True)
        self._thread.start()
        return self.directory / manifest.state_file

    def _fence(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer.step`` wait until the deferred copies are done (hooked once)."""
        if id(optimizer) not in self._hooked:
            def wait_for_copies(*_: Any) -> None:
                if self._staged.is_set():
                    return
                began = time.perf_counter()
                with phase("checkpoint"):  # the report counts this wait as checkpoint stall
                    self._staged.wait()
                self.fence_wait_s += time.perf_counter() - began

            self._hooked[id(optimizer)] = optimizer.register_step_pre_hook(wait_for_copies)

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
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()
        self._lock.release()

    # -- the writer thread ----------------------------------------------------------------

    def _write(self, payload: dict[str, Any], manifest: Manifest) -> None:
        began = time.perf_counter()
        try:
            self._stager.copy_pending()
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"
            say(f"checkpoint {manifest.state_file} failed while copying the state: {self._error}")
            return
        finally:
            self._staged.set()  # optimizer.step may go on
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
