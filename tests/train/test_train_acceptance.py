"""Acceptance tests of clusterddp.train with real gloo processes on CPU (issue 3)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from clusterddp.train.exitcodes import NONFINITE_LOSS_EXIT_CODE, PREEMPTED_EXIT_CODE
from rankrun import SCENARIOS, assert_ok, run_ranks

_spec = importlib.util.spec_from_file_location("train_scenarios", SCENARIOS)
scenarios = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(scenarios)  # type: ignore[union-attr]


def _params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_two_rank_ddp_matches_one_process_with_same_global_batch(tmp_path: Path) -> None:
    """2 ranks x batch 8 train to the same parameters as 1 process x batch 16."""
    assert_ok(run_ranks(["train", str(tmp_path), "--batch", "8", "--epochs", "2"]))
    ddp = _params(tmp_path / "params.pt")
    single_dir = tmp_path / "single"
    single_dir.mkdir()
    scenarios.train(single_dir, batch=16, epochs=2)
    single = _params(single_dir / "params.pt")
    initial = scenarios.make_model().state_dict()
    for name, value in single.items():
        assert not torch.allclose(value, initial[name]), f"{name} did not train"
        torch.testing.assert_close(ddp[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_preempt_checkpoint_resume_equals_uninterrupted_run(tmp_path: Path, nproc: int) -> None:
    """SIGUSR1 to one rank -> all ranks checkpoint and exit 75 -> resume ends where an uninterrupted
    run ends, bit for bit, also on 4 ranks (where DDP's bucket order decides the sums' order)."""
    common = ["--batch", str(16 // nproc), "--epochs", "3", "--dropout", "0.3"]  # 4 steps per epoch
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    straight.mkdir()
    cut.mkdir()
    ckpt = str(cut / "ckpt")
    assert_ok(run_ranks(["train", str(straight), *common], nproc=nproc))

    stopped = run_ranks(["train", str(cut), *common, "--checkpoint-dir", ckpt,
                         "--kill-at-call", "6"], nproc=nproc)
    assert [r.returncode for r in stopped] == [PREEMPTED_EXIT_CODE] * nproc, stopped
    assert "preempted by SIGUSR1" in stopped[0].stderr
    state = torch.load(Path(ckpt) / "last.pt", weights_only=True)["train_state"]
    # SIGUSR1 in epoch 1 step 1 rides that step's agreement, which every rank reads while
    # step 2 runs: all stop after step 2, one step later (3 of 4 steps done, mid-epoch).
    assert (state["epoch"], state["step"]) == (1, 3), state
    assert not (cut / "params.pt").exists()

    resumed = run_ranks(["train", str(cut), *common, "--checkpoint-dir", ckpt,
                         "--resume", "auto"], nproc=nproc)
    assert_ok(resumed)
    assert "resumed from" in resumed[0].stdout
    expected, got = _params(straight / "params.pt"), _params(cut / "params.pt")
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_distributed_accuracy_on_odd_sized_set_equals_single_process(tmp_path: Path) -> None:
    """On 101 samples, 2 ranks count each sample once: same correct/total as 1 process."""
    assert_ok(run_ranks(["eval", str(tmp_path), "--size", "101"]))
    distributed = json.loads((tmp_path / "eval.json").read_text())
    single = scenarios.evaluate_odd(tmp_path, 101)
    assert single["total"] == 101
    assert distributed == single
    assert 0 < single["correct"] < 101  # a real mix, so a miscount would show


def test_merged_inference_equals_single_process(tmp_path: Path) -> None:
    """Per-rank shards merged on rank 0 give the single-process rows, in order, no duplicates."""
    assert_ok(run_ranks(["infer", str(tmp_path / "ddp"), "--size", "37"]))
    merged = [json.loads(line) for line in (tmp_path / "ddp" / "predictions.jsonl").open()]
    shards = sorted((tmp_path / "ddp" / "shards").glob("predictions.rank*.jsonl"))
    assert len(shards) == 2
    single_path = scenarios.infer(tmp_path / "single", 37)
    single = [json.loads(line) for line in single_path.open()]
    assert [r["index"] for r in merged] == list(range(37))
    assert [(r["index"], r["pred"]) for r in merged] == [(r["index"], r["pred"]) for r in single]
    assert [r["score"] for r in merged] == pytest.approx([r["score"] for r in single], rel=1e-6)


def test_nan_loss_on_one_rank_stops_all_ranks_at_the_next_step_with_one_message(tmp_path: Path) -> None:
    """A NaN on rank 1 at step 2 makes both ranks stop one step later and exit 65, no collective left
    to time out; rank 0 says why, once."""
    # A rank left waiting in a collective would wait out the hour of CLUSTERDDP_DIST_TIMEOUT,
    # far past run_ranks' deadline (which ends as soon as both ranks have exited): no timing claim.
    results = run_ranks(["train", str(tmp_path), "--nan-at-call", "3"], timeout=600,
                        env={"CLUSTERDDP_DIST_TIMEOUT": "3600"})
    assert [r.returncode for r in results] == [NONFINITE_LOSS_EXIT_CODE] * 2, results
    message = "non-finite loss at epoch 0 step 2 on rank 1 (nan)"
    assert message in results[0].stderr, results[0].stderr
    assert "non-finite" not in results[1].stderr
    assert "Traceback" not in results[0].stderr + results[1].stderr
    # The verdict of step 2 is read by both ranks while step 3 runs, before its update.
    stops = [json.loads((tmp_path / f"stopped.rank{r}.json").read_text()) for r in range(2)]
    assert stops[0] == stops[1] == {"epoch": 0, "step": 2, "stopped_at": 3, "calls": 4,
                                    "finite": True}


def test_single_process_run_needs_no_launcher_and_beats_the_heartbeat(tmp_path: Path) -> None:
    """The same script runs as plain `python script.py`; the loop touches the heartbeat file."""
    import subprocess

    from rankrun import clean_env

    beat = tmp_path / "heartbeat"
    proc = subprocess.run([sys.executable, str(SCENARIOS), "train", str(tmp_path), "--epochs", "1"],
                          env=clean_env(CLUSTERDDP_HEARTBEAT_FILE=str(beat)),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "params.pt").exists()
    assert beat.exists()


def _all_tensors(obj: object) -> list[torch.Tensor]:
    """Every tensor inside a loaded checkpoint (nested dicts, lists and tuples)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _all_tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _all_tensors(v)]
    return []


@pytest.mark.parametrize("optimizer", ["default", "fused"])
def test_nan_before_a_checkpoint_is_caught_within_one_step_and_never_saved(
        tmp_path: Path, optimizer: str) -> None:
    """NaN on rank 1 at the last step of epoch 1, with a preemption agreed just before it: every
    rank stops within one step, the NaN beats the preemption checkpoint, and every checkpoint
    file and every rank's in-memory weights stay finite."""
    ckpt = tmp_path / "ckpt"
    # 64 samples / (2 ranks x 8) = 4 steps an epoch: loss call 8 is epoch 1 step 3, the last
    # before the epoch's checkpoint; rank 0's SIGUSR1 at call 7 asks for a preemption
    # checkpoint after that same step.
    args = ["train", str(tmp_path), "--epochs", "3", "--checkpoint-dir", str(ckpt),
            "--nan-at-call", "8", "--kill-at-call", "7", "--kill-rank", "0"]
    results = run_ranks(args + (["--fused"] if optimizer == "fused" else []), timeout=600)
    assert [r.returncode for r in results] == [NONFINITE_LOSS_EXIT_CODE] * 2, results
    assert "non-finite loss at epoch 1 step 3 on rank 1 (nan)" in results[0].stderr
    assert "preempted" not in results[0].stderr
    for rank in range(2):
        stop = json.loads((tmp_path / f"stopped.rank{rank}.json").read_text())
        assert (stop["epoch"], stop["step"]) == (1, 3), stop
        assert 0 <= stop["stopped_at"] - stop["step"] <= 1 and stop["calls"] == 8, stop
        assert stop["finite"], f"rank {rank} weights took the NaN update: {stop}"
    files = sorted(f.name for f in ckpt.iterdir())
    # epoch 0's checkpoint (state, manifest, the last.pt link) and the run lock, nothing after the NaN
    assert files == [".lock", "ckpt-000001.json", "ckpt-000001.pt", "last.pt"], files
    saved = torch.load(ckpt / "last.pt", weights_only=True)
    assert saved["train_state"]["epoch"] == 1 and saved["train_state"]["step"] == 0
    tensors = [t for t in _all_tensors({k: saved[k] for k in ("model", "optimizer")})
               if t.is_floating_point()]
    assert tensors and all(torch.isfinite(t).all() for t in tensors)

