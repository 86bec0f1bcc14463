"""Unit tests of the small pieces of clusterddp.train, in one process."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from clusterddp import train as T
from clusterddp.train import liveness
from clusterddp.train.data import ResumableDistributedSampler, ShardSampler, default_num_workers
from clusterddp.train.shards import merge_shards, shard_path, write_shard


def single() -> T.DistContext:
    return T.init_distributed(env={}, argv=[])


@pytest.mark.parametrize("size, world", [(10, 3), (7, 2), (2, 4), (0, 2), (12, 4)])
def test_shard_sampler_covers_every_index_exactly_once(size: int, world: int) -> None:
    """Union of the ranks' shards is 0..size-1, no repeats, and len() is what iteration yields."""
    data = list(range(size))
    seen = []
    for rank in range(world):
        shard = list(ShardSampler(data, world, rank))
        assert len(shard) == len(ShardSampler(data, world, rank))
        seen += shard
    assert sorted(seen) == data


def test_resumable_sampler_skip_yields_the_tail_of_the_same_epoch() -> None:
    """Skipping n samples gives exactly what an uninterrupted epoch yields after n."""
    data = list(range(50))
    full = ResumableDistributedSampler(data, num_replicas=2, rank=1, seed=4)
    full.set_epoch(3)
    part = ResumableDistributedSampler(data, num_replicas=2, rank=1, seed=4)
    part.set_epoch(3, skip=10)
    assert list(part) == list(full)[10:] and len(part) == 15
    part.set_epoch(4)
    assert len(list(part)) == 25 and list(part) != list(full)


def test_set_epoch_reshuffles_and_skips_whole_batches() -> None:
    """set_epoch changes the order per epoch and skip_batches drops batches, not samples."""
    ctx = single()
    loader = T.make_train_loader(TensorDataset(torch.arange(40)), 4, ctx, num_workers=0)
    T.set_epoch(loader, 0)
    epoch0 = [b[0].tolist() for b in loader]
    T.set_epoch(loader, 1)
    epoch1 = [b[0].tolist() for b in loader]
    assert epoch0 != epoch1 and sorted(sum(epoch0, [])) == list(range(40))
    T.set_epoch(loader, 0, skip_batches=3)
    assert [b[0].tolist() for b in loader] == epoch0[3:]
    assert not loader.pin_memory  # no CUDA here


def test_default_num_workers_leaves_a_core_per_rank_and_caps_at_eight() -> None:
    """Loader workers never exceed the rank's share of cores minus one, nor 8."""
    cores = len(os.sched_getaffinity(0))
    assert default_num_workers(1) == max(0, min(8, cores - 1))
    assert default_num_workers(cores) == 0


def test_freeze_by_pattern_with_keep_and_typo_guard() -> None:
    """'*' minus 'fc.*' freezes all but the head; a pattern matching nothing raises."""
    model = nn.Sequential()
    model.add_module("body", nn.Linear(2, 2))
    model.add_module("fc", nn.Linear(2, 1))
    frozen = T.freeze_parameters(model, ["*"], keep=["fc.*"])
    assert frozen == ["body.weight", "body.bias"]
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["fc.weight", "fc.bias"]
    with pytest.raises(ValueError, match="matches no parameter"):
        T.freeze_parameters(model, ["layer9.*"])


def test_scale_lr_is_opt_in_and_rules_are_exact() -> None:
    """none keeps lr, linear multiplies by the world size, sqrt by its root."""
    assert T.scale_lr(0.1, 8, "none") == 0.1
    assert T.scale_lr(0.1, 8, "linear") == pytest.approx(0.8)
    assert T.scale_lr(0.1, 4, "sqrt") == pytest.approx(0.2)
    with pytest.raises(ValueError):
        T.scale_lr(0.1, 4, "cubic")


def test_single_process_context_makes_helpers_no_ops() -> None:
    """Without a launcher: rank 0 of 1, no process group, collectives return their input."""
    ctx = single()
    assert (ctx.rank, ctx.world_size, ctx.distributed, ctx.is_main) == (0, 1, False, True)
    assert T.get_rank() == 0 and T.get_world_size() == 1 and T.is_main_process()
    T.barrier()
    x = torch.tensor([1.5])
    assert T.reduce_value(x) is x and T.reduce_value(2.0, average=False) == 2.0
    model = nn.Linear(2, 2)
    assert T.prepare_model(model, ctx, sync_bn=True) is model  # no DDP, no SyncBN


def test_sync_batchnorm_is_skipped_on_cpu_with_a_reason(capsys) -> None:
    """torch has no CPU SyncBatchNorm: the switch keeps BatchNorm and rank 0 says so."""
    ctx = T.DistContext(rank=0, world_size=2, local_rank=0, local_world_size=2,
                        device=torch.device("cpu"), backend="gloo", source="test")
    model = nn.Sequential(nn.BatchNorm1d(3))
    assert T.convert_sync_batchnorm(model, ctx) is model
    assert isinstance(model[0], nn.BatchNorm1d)
    assert "SyncBatchNorm needs GPUs" in capsys.readouterr().err


def test_agree_step_raises_on_nan_and_reports_preemption() -> None:
    """A finite loss passes with its value and the preempt flag; NaN raises the clear error."""
    ctx = single()
    verdict = T.agree_step(torch.tensor(0.25), True, ctx, epoch=1, step=2)
    assert verdict.mean_loss == 0.25 and verdict.preempt
    with pytest.raises(T.NonFiniteLossError, match="epoch 3 step 4 on rank 0 \\(inf\\)"):
        T.agree_step(torch.tensor(float("inf")), False, ctx, epoch=3, step=4)


def test_preemption_handler_only_sets_a_flag_and_restores_handlers() -> None:
    """A real SIGUSR1 sets requested (the process lives on); uninstall restores the old handler."""
    before = signal.getsignal(signal.SIGUSR1)
    with T.PreemptionHandler(["USR1"]) as handler:
        assert not handler.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert handler.requested and handler.signal_name == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before
    with pytest.raises(ValueError, match="unknown signal"):
        T.PreemptionHandler(["SIGNOPE"])


#: A child that re-arms a PreemptionHandler after every request, says "r" when armed, and
#: dumps its stacks on SIGUSR2 (faulthandler works while the main thread is blocked).
_PAIRS_CHILD = r"""
import faulthandler, os, signal, sys
faulthandler.register(signal.SIGUSR2, all_threads=True)
from clusterddp.train.preempt import PreemptionHandler
while True:
    handler = PreemptionHandler(["SIGUSR1"]).install()
    os.write(1, b"r")
    spins = 0
    while not handler.requested:
        spins += 1
    for _ in range(2000):  # room for the second signal of the pair to land in this handler
        spins += 1
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
"""


@pytest.mark.slow
def test_preemption_signal_twice_in_a_row_never_blocks_the_rank() -> None:
    """2000 pairs of SIGUSR1 a few microseconds apart (slurmstepd's and the launcher's copy):
    the handler always returns. With threading.Event.set() in the handler the nested second
    handler blocked on the lock of the first, within the first 150 pairs in every trial."""
    import random
    import select
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", _PAIRS_CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        for pair in range(2000):
            ready, _, _ = select.select([child.stdout], [], [], 5.0)
            if not ready:
                os.kill(child.pid, signal.SIGUSR2)
                time.sleep(0.5)
                child.kill()
                pytest.fail(f"the handler blocked after pair {pair}:\n{child.communicate()[1].decode()[-2000:]}")
            assert os.read(child.stdout.fileno(), 1) == b"r"  # type: ignore[union-attr]
            gap = random.random() * 40e-6
            os.kill(child.pid, signal.SIGUSR1)
            start = time.perf_counter()
            while time.perf_counter() - start < gap:
                pass
            os.kill(child.pid, signal.SIGUSR1)
    finally:
        child.kill()
        child.communicate()


def test_preempted_exits_with_75() -> None:
    """Preempted is a SystemExit carrying EX_TEMPFAIL, so finally blocks run and no traceback."""
    exc = T.Preempted("ckpt.pt", "SIGTERM")
    assert isinstance(exc, SystemExit) and exc.code == T.PREEMPTED_EXIT_CODE == 75


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    """A failed save leaves the previous checkpoint intact and no temp file behind."""
    path = tmp_path / "last.pt"
    T.atomic_save({"v": torch.tensor(1)}, path)
    with pytest.raises(Exception):
        T.atomic_save({"v": lambda: 0}, path)  # lambdas cannot be pickled
    assert torch.load(path, weights_only=True)["v"].item() == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_checkpoint_round_trip_restores_model_optimizer_position_and_rng(tmp_path: Path) -> None:
    """Loading restores weights, optimizer momentum, epoch/step and the RNG stream."""
    ctx = single()
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    T.save_checkpoint(tmp_path / "c.pt", ctx, model=model, optimizer=opt,
                      state=T.TrainState(epoch=2, step=5, loss_sum=1.5))
    expected_draw = torch.rand(3)
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    fresh = nn.Linear(3, 2)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(999)
    state, _ = T.load_checkpoint(tmp_path / "c.pt", ctx, model=fresh, optimizer=fresh_opt)
    assert state == T.TrainState(epoch=2, step=5, loss_sum=1.5)
    assert torch.equal(torch.rand(3), expected_draw)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, weights[k])
    assert torch.equal(fresh_opt.state_dict()["state"][0]["momentum_buffer"],
                       opt.state_dict()["state"][0]["momentum_buffer"])


def test_evaluate_refuses_a_padding_distributed_sampler() -> None:
    """The seeds' DistributedSampler eval loader is rejected instead of miscounting."""
    ctx = single()
    data = TensorDataset(torch.randn(5, 2), torch.zeros(5, dtype=torch.long))
    padded = DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=0))
    with pytest.raises(ValueError, match="pads 5 samples to 6"):
        T.evaluate(nn.Linear(2, 2), padded, ctx)


def test_evaluate_counts_exactly_and_restores_training_mode() -> None:
    """Accuracy is correct/total over every sample; the model goes back to train mode."""
    ctx = single()
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    x = torch.tensor([[1.0, 0], [0, 1], [1, 0], [0, 1], [1, 0]])
    y = torch.tensor([0, 1, 1, 1, 0])
    result = T.evaluate(model, T.make_eval_loader(TensorDataset(x, y), 2, ctx, num_workers=0), ctx)
    assert (result.correct, result.total, result.accuracy) == (4, 5, 0.8)
    assert model.training


def test_amp_on_cpu_uses_bfloat16_autocast_and_no_scaler() -> None:
    """CPU AMP: matmuls run in bfloat16, the GradScaler is inactive; disabled AMP is float32."""
    on = T.Amp(torch.device("cpu"), enabled=True)
    with on.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
    assert not on.scaler.is_enabled() and on.state_dict() == {}
    with T.Amp(torch.device("cpu")).autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32


def test_merge_orders_rows_drops_identical_repeats_and_checks_coverage(tmp_path: Path) -> None:
    """Shards merge in index order; a padded repeat is dropped; gaps and conflicts raise."""
    write_shard([{"index": 0, "p": 1}, {"index": 2, "p": 3}, {"index": 0, "p": 1}], tmp_path, "r", 0)
    write_shard([{"index": 1, "p": 2}], tmp_path, "r", 1)
    merged = merge_shards(tmp_path, "r", 2, tmp_path / "m.jsonl", expected=3)
    assert [json.loads(line) for line in merged.open()] == [
        {"index": 0, "p": 1}, {"index": 1, "p": 2}, {"index": 2, "p": 3}]
    with pytest.raises(ValueError, match="1 missing"):
        merge_shards(tmp_path, "r", 2, tmp_path / "m.jsonl", expected=4)
    with pytest.raises(FileNotFoundError, match="1 of 3 result shards are missing"):
        merge_shards(tmp_path, "r", 3, tmp_path / "m.jsonl")
    write_shard([{"index": 1, "p": 9}], tmp_path, "r", 0)
    with pytest.raises(ValueError, match="two different results"):
        merge_shards(tmp_path, "r", 2, tmp_path / "m.jsonl")
    with pytest.raises(ValueError, match="integer 'index'"):
        write_shard([{"p": 1}], tmp_path, "r", 0)
    assert shard_path(tmp_path, "r", 3).name == "r.rank00003.jsonl"


def test_heartbeat_touches_the_file_at_most_once_per_second(tmp_path: Path, monkeypatch) -> None:
    """First call creates the file, calls within a second are dropped, no env var means off."""
    liveness.reset()
    assert not T.heartbeat()  # env var unset
    beat = tmp_path / "beat"
    monkeypatch.setenv("CLUSTERDDP_HEARTBEAT_FILE", str(beat))
    liveness.reset()
    assert T.heartbeat() and beat.exists()
    os.utime(beat, (0, 0))
    assert not T.heartbeat() and beat.stat().st_mtime == 0
    monkeypatch.setattr(liveness._state, "last_write", time.monotonic() - 1.5)
    assert T.heartbeat() and beat.stat().st_mtime > 0
    liveness.reset()


def test_scalar_logger_writes_tensorboard_events_on_rank_zero_only(tmp_path: Path) -> None:
    """Rank 0 gets an event file; rank 1 writes nothing."""
    main = single()
    other = T.DistContext(rank=1, world_size=2, local_rank=1, local_world_size=2,
                          device=torch.device("cpu"), backend="gloo", source="test")
    for ctx, sub in ((main, "r0"), (other, "r1")):
        logger = T.ScalarLogger(str(tmp_path / sub), ctx)
        logger.log({"train/loss": 1.0}, 1)
        logger.close()
    assert list((tmp_path / "r0").glob("events.out.tfevents.*"))
    assert not (tmp_path / "r1").exists()


def test_mid_epoch_position_is_rescaled_when_the_world_size_changes() -> None:
    """3 steps of 2 ranks are 6 steps of 1 rank; never more than one epoch's steps."""
    from clusterddp.train.loop import _rescale

    ctx = single()
    loader = T.make_train_loader(TensorDataset(torch.arange(40)), 4, ctx, num_workers=0)
    moved = _rescale(T.TrainState(epoch=1, step=3, loss_sum=3.0, world_size=2), ctx, loader)
    assert moved == T.TrainState(epoch=1, step=6, loss_sum=6.0, world_size=1)
    capped = _rescale(T.TrainState(epoch=1, step=9, loss_sum=9.0, world_size=4), ctx, loader)
    assert capped.step == 10
    same = T.TrainState(epoch=1, step=3, loss_sum=3.0, world_size=1)
    assert _rescale(same, ctx, loader) is same


def test_agreement_is_read_one_step_late_and_skips_the_nan_step_on_the_device() -> None:
    """Step k's verdict is read while step k+1 runs; a NaN step's skip flag is 1.0 at once."""
    ctx = single()
    agreement = T.StepAgreement(ctx)
    agreement.start(torch.tensor(0.5), False, epoch=0, step=0)
    assert agreement.land().item() == 0.0
    assert agreement.settle(keep=1, stopped_at=0) == []  # step 0 not read during step 0
    agreement.start(torch.tensor(float("nan")), True, epoch=0, step=1)
    assert agreement.land().item() == 1.0  # the device knows now, the host does not
    [verdict] = agreement.settle(keep=1, stopped_at=1)
    assert (verdict.step, verdict.mean_loss, verdict.preempt) == (0, 0.5, False)
    agreement.start(torch.tensor(0.25), False, epoch=0, step=2)
    agreement.land()
    with pytest.raises(T.NonFiniteLossError, match="epoch 0 step 1 on rank 0 \\(nan\\).*"
                       "stopped before updating step 2") as caught:
        agreement.settle(keep=1, stopped_at=2)
    assert (caught.value.step, caught.value.stopped_at) == (1, 2)


def _nan_grads(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_step_unless_skips_a_fused_update_exactly(kind: str) -> None:
    """With skip=1.0 a fused step leaves weights and optimizer state bit-identical; 0.0 steps."""
    model = nn.Linear(3, 2)
    opt = T.make_optimizer(kind, model.parameters(), torch.device("cpu"), fused=True, lr=0.1,
                           weight_decay=0.01, **({"momentum": 0.9} if kind == "sgd" else {}))
    model(torch.randn(4, 3)).sum().backward()
    T.step_unless(opt, torch.tensor(0.0))
    weights = [p.detach().clone() for p in model.parameters()]
    state = [{k: v.clone() for k, v in s.items()} for s in opt.state.values()]
    _nan_grads(model)
    T.step_unless(opt, torch.tensor(1.0))
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    for before, after in zip(state, opt.state.values()):
        assert all(torch.equal(v, after[k]) for k, v in before.items())


def test_step_unless_keeps_an_unfused_optimizer_finite() -> None:
    """Without found_inf support a flagged step is not taken (CPU) and weights stay finite."""
    model = nn.Linear(3, 2)
    opt = T.make_optimizer("sgd", model.parameters(), torch.device("cpu"), lr=0.1, momentum=0.9)
    assert not opt.param_groups[0]["fused"]
    weights = [p.detach().clone() for p in model.parameters()]
    _nan_grads(model)
    T.step_unless(opt, torch.tensor(1.0))
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert not opt.state  # no momentum taken in either


def test_gradients_are_zeroed_on_the_device_only_where_the_flag_is_set() -> None:
    """The GPU path for unfused optimizers: NaN gradients become zeros at 1.0, stay at 0.0."""
    from clusterddp.train.optim import zero_grads_where

    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _nan_grads(model)
    zero_grads_where(opt, torch.tensor(0.0))
    assert all(torch.isnan(p.grad).all() for p in model.parameters())
    zero_grads_where(opt, torch.tensor(1.0))
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


def test_fused_sgd_is_primed_so_a_skipped_first_step_is_harmless_and_changes_no_number() -> None:
    """Primed fused SGD equals torch's fused SGD bit for bit (default SGD to the last bit), and a skipped first
    step leaves zero momentum (torch's own fused SGD keeps uninitialised memory there)."""
    def run(build, skip_first: bool) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        model = nn.Linear(5, 3)
        opt = build(model.parameters())
        if skip_first:
            model(torch.randn(2, 5)).sum().backward()
            T.step_unless(opt, torch.tensor(1.0))
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 5)).pow(2).sum().backward()
            T.step_unless(opt, torch.tensor(0.0))
        return [p.detach() for p in model.parameters()]

    hyper = {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}
    ours = run(lambda ps: T.make_optimizer("sgd", ps, torch.device("cpu"), fused=True, **hyper),
               False)
    fused = run(lambda ps: torch.optim.SGD(ps, fused=True, **hyper), False)
    assert all(torch.equal(a, b) for a, b in zip(ours, fused))
    # torch's own fused CPU kernel may differ from its default SGD in the last bit: on AVX512 it
    # fuses a multiply-add (1.2e-7 here). Bit for bit is promised against the fused kernel only.
    default = run(lambda ps: torch.optim.SGD(ps, **hyper), False)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(ours, default))
    skipped = run(lambda ps: T.make_optimizer("sgd", ps, torch.device("cpu"), fused=True,
                                              **hyper), True)
    assert all(torch.isfinite(p).all() for p in skipped)
    with pytest.raises(ValueError, match="known: sgd, adam, adamw"):
        T.make_optimizer("lion", [], torch.device("cpu"))


def test_amp_modes_and_the_fp16_scaler_obeys_the_agreed_skip_flag() -> None:
    """True picks bf16 on CPU, names are checked, and fp16's GradScaler skips a flagged step."""
    cpu = torch.device("cpu")
    assert [T.choose_amp(r, cpu) for r in (True, False, None, "auto", "BF16", "fp16", "off")] \
        == ["bf16", "off", "off", "bf16", "bf16", "fp16", "off"]
    with pytest.raises(ValueError, match="auto, bf16, fp16, off"):
        T.choose_amp("fp8", cpu)
    amp = T.Amp(cpu, "fp16")
    assert amp.scaler.is_enabled() and amp.dtype == torch.float16
    amp.scaler = torch.amp.GradScaler("cpu", init_scale=8.0)  # no real fp16 overflow here
    model = nn.Linear(3, 2)
    opt = T.make_optimizer("sgd", model.parameters(), cpu, fused=True, lr=0.1, momentum=0.9)
    for skip, changes in ((1.0, False), (0.0, True)):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        with amp.autocast():
            loss = model(torch.randn(4, 3)).float().sum()
        amp.backward(loss)  # finite: only the flag can make the scaler skip
        amp.step(opt, skip=torch.tensor(skip))
        same = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert same != changes, f"skip={skip}"


def test_checkpoint_with_a_non_finite_weight_is_refused_and_not_written(tmp_path: Path) -> None:
    """save_checkpoint raises NonFiniteWeightsError and leaves no file when a weight is NaN."""
    ctx = single()
    model = nn.Linear(2, 2)
    T.save_checkpoint(tmp_path / "ok.pt", ctx, model=model)
    with torch.no_grad():
        model.bias[0] = float("inf")
    with pytest.raises(T.NonFiniteWeightsError, match="rank\\(s\\) 0 hold NaN or infinite"):
        T.save_checkpoint(tmp_path / "bad.pt", ctx, model=model)
    assert [p.name for p in tmp_path.iterdir()] == ["ok.pt"]


@pytest.mark.slow
def test_loader_processes_outlive_the_schedulers_warning_signals() -> None:
    """SIGUSR1, SIGUSR2 and SIGTERM to the loader processes (SLURM signals every process of the
    step) kill none of them: the epoch's batches all arrive (the trainer can finish its step
    and checkpoint). Without the loader's worker_init_fn the first signal kills a loader process
    and the next batch raises."""
    data = TensorDataset(torch.arange(64).float())
    loader = T.make_train_loader(data, 4, single(), num_workers=2, shuffle=False)
    iterator = iter(loader)
    seen = [next(iterator)[0]]
    pids = [worker.pid for worker in iterator._workers]  # type: ignore[attr-defined]
    time.sleep(1.0)  # every loader process past its start (worker_init_fn has run)
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        for pid in pids:
            os.kill(pid, sig)
    time.sleep(0.3)
    seen.extend(batch[0] for batch in iterator)
    assert torch.equal(torch.cat(seen), torch.arange(64).float())


def test_a_rank_bound_to_its_share_is_not_divided_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 ranks on a 16-CPU node, each bound to 8: 7 loaders each (was 8 // 2 - 1 = 3); unbound,
    both with the node's 16: 16 // 2 - 1 = 7 as before."""
    sets = {0: set(range(8)), os.getppid(): set(range(16))}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: sets[pid])
    assert default_num_workers(2) == 7
    sets[0] = set(range(16))
    assert default_num_workers(2) == 7
    sets[0] = set(range(4))  # bound to 4 of 16: its own 4, less one for the rank
    assert default_num_workers(2) == 3
