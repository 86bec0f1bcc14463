"""The training loop: the helpers of this package wired together in the order they need.

``train_one_epoch`` is the step loop (AMP, one agreed all-reduce per step for loss, NaN
and preemption, overlapped with the backward pass and read one step late so the host never
waits for the GPU, the progress file with the step's own compute, rank-0 bar). ``fit`` adds
the epoch loop around it: resume,
``set_epoch``, evaluation, TensorBoard, a checkpoint per epoch, and the preemption exit.
Scripts with unusual needs can use the pieces directly; the example jobs use ``fit``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from clusterddp.train.amp import Amp
from clusterddp.train.asyncckpt import Checkpointer
from clusterddp.train.checkpoint import TrainState, load_checkpoint
from clusterddp.train.ckptstore import newest_complete, say
from clusterddp.train.data import set_epoch
from clusterddp.train.dist import DistContext, all_gather_objects
from clusterddp.train.evaluation import evaluate, move_to
from clusterddp.train.exitcodes import PREEMPTED_EXIT_CODE
from clusterddp.train.guard import LAG, StepAgreement, StepVerdict
from clusterddp.train.interval import INTERVAL_FILE, choose, read_history, run_dir_from_env
from clusterddp.train.liveness import heartbeat
from clusterddp.train.model import settle_buckets
from clusterddp.train.preempt import DEFAULT_SIGNALS, Preempted, PreemptionHandler
from clusterddp.train.display import ScalarLogger, progress

#: File name of the newest checkpoint's state inside ``checkpoint_dir`` (a hard link kept
#: for tools; resume picks by manifest, ``ckptstore``), and the whole checkpoint of older
#: clusterddp versions, which ``resume="auto"`` still reads when no manifest is there.
LAST_CHECKPOINT = "last.pt"

Criterion = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class EpochResult:
    """One (possibly partial) epoch of training, as all ranks agreed on it."""

    epoch: int
    mean_loss: float   # mean over the epoch's steps of the all-rank mean loss
    steps_done: int    # batches of this epoch completed, counting those before a resume
    loss_sum: float    # running sum behind mean_loss, kept for mid-epoch checkpoints
    preempted: bool


@dataclass(frozen=True)
class FitConfig:
    """Everything ``fit`` needs besides the model, data and optimizer."""

    epochs: int
    checkpoint_dir: str | None = None
    resume: str | None = None  # a checkpoint path, "auto" (newest complete in checkpoint_dir), None
    checkpoint_every: int | str = 0  # also every N steps (0: epoch ends and preemption only);
    # "auto": Young/Daly from the measured stall and the run records' failures (interval.py)
    checkpoint_min_s: float = 60.0    # checkpoint_every="auto" keeps the interval within these
    checkpoint_max_s: float = 3600.0
    checkpoint_mode: str = "async"  # "async": written in the background; "sync": training waits
    keep_checkpoints: int = 2  # complete checkpoints kept in checkpoint_dir
    job_name: str | None = None  # recorded in manifests; resume ignores other jobs' checkpoints
    tensorboard_dir: str | None = None
    amp: bool | str = False  # True or "auto", "bf16", "fp16", False or "off" (amp.py)
    progress: bool | None = None  # rank-0 tqdm bar; None: only when stderr is a terminal
    preempt_signals: Sequence[str] = DEFAULT_SIGNALS  # empty: leave signals alone


@dataclass
class FitResult:
    """What ``fit`` did; ``history`` has one dict of metrics per epoch run here."""

    start_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class _Tally:
    """An epoch's totals from the verdicts read so far (one step behind the loop)."""

    read: int          # steps whose verdict is known, counting those before a resume
    loss_sum: float
    preempt: bool = False

    def add(self, verdicts: list[StepVerdict]) -> None:
        for verdict in verdicts:
            self.read += 1
            self.loss_sum += verdict.mean_loss
            self.preempt = self.preempt or verdict.preempt


def train_one_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer,
                    criterion: Criterion, ctx: DistContext, *, epoch: int, amp: Amp,
                    start: TrainState | None = None, preemption: PreemptionHandler | None = None,
                    show_progress: bool | None = None, global_step: int | None = None, save_every: int = 0,
                    save: Callable[[TrainState], Any] | None = None,
                    save_due: Callable[[int], bool] | None = None) -> EpochResult:
    """Run the loader's remaining batches; stop early, after a whole step, on preemption.

    ``start`` continues a partly run epoch (its step and loss sum); the loader must already
    skip those batches (``set_epoch(loader, epoch, skip_batches=start.step)``).
    Step k's verdict (guard.py) is read while step k+1 runs, before its update is queued,
    and every verdict is read before this returns. So ``NonFiniteLossError`` is raised on
    every rank together at most one step after the bad loss (whose update was skipped on
    the device), and a preemption agreed at step k ends the epoch after step k+1.

    ``global_step`` numbers the steps across epochs (the report counts redone steps by it); with
    ``save``, each step ``save_due`` (or ``save_every``) names, but the epoch's last, is
    checkpointed after the pending verdicts: none holds an update after a non-finite loss.
    """
    model.train()
    step = start.step if start else 0
    epoch_steps = _epoch_steps(loader, step)
    numbered = global_step if global_step is not None else 0
    tally = _Tally(step, start.loss_sum if start else 0.0)
    agreement = StepAgreement(ctx)
    bar = progress(loader, ctx, desc=f"epoch {epoch}", enabled=show_progress)
    try:
        for inputs, targets in bar:
            began = time.perf_counter()  # the batch is in hand: the rank's own work begins
            loss = _forward(model, criterion, amp, move_to(inputs, ctx.device), move_to(targets, ctx.device))
            agreement.start(loss, preemption is not None and preemption.requested,
                            epoch=epoch, step=step)
            optimizer.zero_grad(set_to_none=True)
            # Own work so far: forward and loss (the agreement's all-reduce is only launched);
            # not backward: under DDP it ends waiting for the gradient all-reduce.
            compute = time.perf_counter() - began
            amp.backward(loss)
            skip = agreement.land()
            tally.add(agreement.settle(keep=LAG, stopped_at=step))  # may raise on every rank
            updating = time.perf_counter()
            amp.step(optimizer, skip=skip)
            step += 1
            numbered += 1
            heartbeat(step=numbered if global_step is not None else None,
                      compute_s=compute + time.perf_counter() - updating)
            if tally.read:  # host values only: the bar adds no sync
                bar.set_description(f"epoch {epoch} loss {tally.loss_sum / tally.read:.4f}", refresh=False)
            if tally.preempt:
                break
            due = save_due(numbered) if save_due is not None else save_every > 0 and numbered % save_every == 0
            if save is not None and due and step != epoch_steps:
                tally.add(agreement.settle(keep=0, stopped_at=step))
                if tally.preempt:
                    break  # the preemption save follows at once
                save(TrainState(epoch, step, tally.loss_sum, ctx.world_size, numbered))
        tally.add(agreement.settle(keep=0, stopped_at=step))
    finally:
        bar.close()
    return EpochResult(epoch=epoch, mean_loss=tally.loss_sum / step if step else float("nan"), steps_done=step,
                       loss_sum=tally.loss_sum, preempted=tally.preempt)


def _epoch_steps(loader: DataLoader, done: int) -> int | None:
    """The epoch's last step (``done`` already run), or None for a loader without a length."""
    try:
        return done + len(loader)
    except TypeError:
        return None


def _forward(model: nn.Module, criterion: Criterion, amp: Amp, inputs: Any, targets: Any) -> torch.Tensor:
    settle_buckets(model, inputs, amp.autocast)  # once: a resumed step sums as any other
    with amp.autocast():
        return criterion(model(inputs), targets)


def resolve_resume(config: FitConfig, ctx: DistContext | None = None) -> Path | None:
    """The checkpoint to resume from, or None for a fresh start.

    ``"auto"``: the newest checkpoint in ``checkpoint_dir`` whose manifest checks out (sizes
    and sha256 of its file, the job name), each newer one ignored with one line on rank 0;
    with no manifest there at all, an older clusterddp's ``last.pt``. Rank 0 looks (hashing
    each file once) and every rank takes its answer.
    """
    if config.resume is None:
        return None
    if config.resume == "auto":
        if config.checkpoint_dir is None:
            raise ValueError("resume='auto' needs a checkpoint_dir to look in")
        chosen: str | None = None
        if ctx is None or ctx.is_main:
            chosen = _newest(Path(config.checkpoint_dir), config.job_name)
        if ctx is not None and ctx.distributed:
            chosen = all_gather_objects(chosen)[0]
        return Path(chosen) if chosen else None
    path = Path(config.resume)
    if not path.exists():
        raise FileNotFoundError(f"resume checkpoint {path} does not exist")
    return path


def _every_steps(every: int | str) -> int:
    if every == "auto":
        return 0
    if isinstance(every, int) and not isinstance(every, bool) and every >= 0:
        return every
    raise ValueError(f"checkpoint_every: {every!r} is not a number of steps or 'auto'")


class AutoInterval:
    """``checkpoint_every="auto"``: rank 0 picks the interval in steps (``interval.choose``)
    after ``WARMUP`` steps and again after every save, from the stalls measured so far, the
    step time since the last decision and the run records; every rank takes its answer at
    the same step (one small all-gather), so all ranks checkpoint at the same steps."""

    WARMUP = 10

    def __init__(self, ctx: DistContext, checkpointer: Checkpointer, config: FitConfig,
                 start_step: int) -> None:
        self.ctx = ctx
        self.checkpointer = checkpointer
        self.config = config
        self.next_at = start_step + self.WARMUP
        self.decided = False
        self.mark = (start_step, time.perf_counter())
        self.every: int | None = None
        self.run_dir = run_dir_from_env()

    def due(self, step: int) -> bool:
        if step < self.next_at:
            return False
        if not self.decided:
            self.decide(step)
            return False
        return True

    def decide(self, step: int) -> None:
        every: int | None = None
        if self.ctx.is_main:
            now = time.perf_counter()
            steps = max(1, step - self.mark[0])
            stalls = self.checkpointer.stalls
            stall = sorted(stalls)[len(stalls) // 2] if stalls else 0.0
            choice = choose(stall, (now - self.mark[1]) / steps,
                            read_history(self.run_dir, self.config.job_name),
                            self.config.checkpoint_min_s, self.config.checkpoint_max_s)
            every = choice.every_steps
            if every != self.every:
                line = choice.line(self.config.job_name)
                say(line)
                self._record(choice, line)
            self.mark = (step, now)
        self.every = all_gather_objects(every)[0]
        self.decided = True
        self.next_at = step + (self.every or 1)

    def _record(self, choice: Any, line: str) -> None:
        """For ``clusterddp report``: the latest choice, beside the run's event log."""
        if not self.run_dir:
            return
        try:
            Path(self.run_dir, INTERVAL_FILE).write_text(json.dumps(
                {"line": line, "every_steps": choice.every_steps, "interval_s": choice.interval_s,
                 "optimum_s": choice.optimum_s, "stall_s": choice.stall_s,
                 "step_s": choice.step_s, "mtbf_s": choice.history.mtbf_s,
                 "failures": choice.history.failures, "exposure_s": choice.history.exposure_s,
                 "runs": choice.history.runs}) + "\n")
        except OSError:
            pass


def _newest(directory: Path, job: str | None) -> str | None:
    scan = newest_complete(directory, job=job)
    for line in scan.ignored:
        say(line)
    if scan.newest is not None:
        return str(scan.newest[0])
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    if any(n.startswith("ckpt-") or n.startswith(".ckpt-") for n in names):
        return None  # checkpoints of this layout, none complete: start over (said above)
    legacy = directory / LAST_CHECKPOINT
    return str(legacy) if legacy.is_file() else None


def _rescale(state: TrainState, ctx: DistContext, loader: DataLoader) -> TrainState:
    """A mid-epoch position saved by a different number of ranks, in this run's steps.

    The same per-rank batch is assumed: ``step`` old steps covered ``step * old_world``
    batches, so about that many divided by the new world size are skipped, at most the
    whole epoch. The shuffle of the rest differs (it depends on the world size), so such
    a resume continues training rather than replaying it bit for bit.
    """
    if not state.step or state.world_size == ctx.world_size:
        return state
    sampler = loader.sampler
    per_epoch = getattr(sampler, "num_samples", len(loader)) // (loader.batch_size or 1)
    step = min(per_epoch, state.step * state.world_size // ctx.world_size)
    _say(ctx, f"checkpoint was written by {state.world_size} rank(s), this run has "
              f"{ctx.world_size}: continuing epoch {state.epoch} at step {step} of {per_epoch}")
    return TrainState(state.epoch, step, state.loss_sum * step / state.step, ctx.world_size,
                      state.global_step)


def _say(ctx: DistContext, message: str) -> None:
    if ctx.is_main:
        print(message, flush=True)


def _leave_preempted(ctx: DistContext, handler: PreemptionHandler | None, epoch: int, step: int,
                     saved: str | None) -> None:
    """Raise ``Preempted`` on every rank, after rank 0 said who was signalled (the signal
    may have reached only some ranks) and where the checkpoint is."""
    names = all_gather_objects(handler.signal_name if handler else None)
    signal_name = next((n for n in names if n), None)
    who = ", ".join(f"{n} on rank {r}" for r, n in enumerate(names) if n)
    if ctx.is_main:
        print(f"clusterddp.train: preempted by {who} at epoch {epoch} step {step}; checkpoint "
              f"{saved or '(none: no checkpoint_dir)'}; exiting with code {PREEMPTED_EXIT_CODE}",
              file=sys.stderr, flush=True)
    raise Preempted(saved, signal_name)


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, train_loader: DataLoader,
        criterion: Criterion, ctx: DistContext, config: FitConfig, *,
        eval_loader: DataLoader | None = None, scheduler: Any = None) -> FitResult:
    """Train for ``config.epochs`` epochs with per-epoch evaluation and checkpoints.

    The scheduler, if any, steps once per epoch. On preemption every rank leaves through
    ``Preempted`` (exit code 75) after the checkpoint is on disk; rerunning the same command
    with ``resume="auto"`` continues from the interrupted step.
    """
    amp = Amp(ctx.device, enabled=config.amp)
    state = _resumed(model, optimizer, scheduler, amp, train_loader, ctx, config)
    checkpointer = (Checkpointer(config.checkpoint_dir, ctx, mode=config.checkpoint_mode,
                                 keep=config.keep_checkpoints, job=config.job_name)
                    if config.checkpoint_dir else None)
    result = FitResult(start_epoch=state.epoch)
    global_step = state.global_step
    auto = (AutoInterval(ctx, checkpointer, config, global_step)
            if checkpointer is not None and config.checkpoint_every == "auto" else None)

    def save(where: TrainState, wait: bool = False) -> str | None:
        if checkpointer is None:
            return None
        saved = checkpointer.save(model=model, optimizer=optimizer, scheduler=scheduler,
                                  amp=amp, state=where, wait=wait)
        if auto is not None and not wait:
            auto.decide(where.global_step)
        return str(saved or checkpointer.directory)
    scalars = ScalarLogger(config.tensorboard_dir, ctx)
    handler = PreemptionHandler(config.preempt_signals) if config.preempt_signals else None
    if handler is not None:
        handler.install()
    try:
        for epoch in range(state.epoch, config.epochs):
            partial = state if epoch == state.epoch and state.step else None
            set_epoch(train_loader, epoch, skip_batches=partial.step if partial else 0)
            trained = train_one_epoch(model, train_loader, optimizer, criterion, ctx,
                                      epoch=epoch, amp=amp, start=partial, preemption=handler,
                                      show_progress=config.progress, global_step=global_step,
                                      save_every=_every_steps(config.checkpoint_every),
                                      save=save, save_due=auto.due if auto else None)
            global_step += trained.steps_done - (partial.step if partial else 0)
            if trained.preempted:
                # Written before exiting, async or not: the save in flight is waited for,
                # then this one (SLURM's grace covers one write, not a queue of them).
                where = TrainState(epoch, trained.steps_done, trained.loss_sum, ctx.world_size,
                                   global_step)
                _leave_preempted(ctx, handler, epoch, trained.steps_done, save(where, wait=True))
            if scheduler is not None:
                scheduler.step()
            metrics, line = _epoch_metrics(model, optimizer, criterion, amp, ctx, trained, eval_loader,
                                           f"epoch {epoch + 1}/{config.epochs}")
            scalars.log(metrics, epoch + 1)
            _say(ctx, line)
            result.history.append(metrics)
            save(TrainState(epoch + 1, world_size=ctx.world_size, global_step=global_step))
        if checkpointer is not None:  # the last save is waited for, and its failure raised
            checkpointer.wait(raise_on_failure=True)
    finally:
        _close(handler, checkpointer, scalars)
    return result


def _close(handler: PreemptionHandler | None, checkpointer: Checkpointer | None, scalars: ScalarLogger) -> None:
    """What ``fit`` holds, let go whatever ended it: the signal handlers, the writer, the scalars."""
    if handler is not None:
        handler.uninstall()
    if checkpointer is not None:
        checkpointer.close()
    scalars.close()


def _resumed(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, amp: Amp,
             train_loader: DataLoader, ctx: DistContext, config: FitConfig) -> TrainState:
    """Where training starts: the checkpoint ``config.resume`` names, loaded, or the beginning."""
    resume_from = resolve_resume(config, ctx)
    if resume_from is None:
        return TrainState()
    state, _ = load_checkpoint(resume_from, ctx, model=model, optimizer=optimizer, scheduler=scheduler, amp=amp)
    _say(ctx, f"resumed from {resume_from} at epoch {state.epoch} step {state.step}")
    return _rescale(state, ctx, train_loader)


def _epoch_metrics(model: nn.Module, optimizer: torch.optim.Optimizer, criterion: Criterion, amp: Amp,
                   ctx: DistContext, trained: EpochResult, eval_loader: DataLoader | None,
                   title: str) -> tuple[dict[str, float], str]:
    """The epoch's scalars (with an evaluation when there is an eval loader) and its line."""
    metrics = {"train/loss": trained.mean_loss, "train/lr": optimizer.param_groups[0]["lr"]}
    line = f"{title}: train loss {trained.mean_loss:.4f}"
    if eval_loader is not None:
        evaluated = evaluate(model, eval_loader, ctx, criterion=criterion, amp=amp)
        metrics["eval/loss"] = evaluated.mean_loss
        metrics["eval/accuracy"] = evaluated.accuracy
        line += (f", eval loss {evaluated.mean_loss:.4f}, accuracy "
                 f"{evaluated.accuracy:.4f} ({evaluated.correct}/{evaluated.total})")
    return metrics, line
