"""The example jobs run under the real launcher (`python -m clusterddp run`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterddp.spec import load_job
from rankrun import REPO, clean_env

JOBS = REPO / "jobs"


def _job_copy(tmp_path: Path, name: str, args: list[str]) -> Path:
    """The shipped job file with smaller args and the script by absolute path."""
    job = yaml.safe_load((JOBS / f"{name}.yaml").read_text())
    job["script"] = str(JOBS / job["script"])
    job["args"] = args
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _launch(job: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterddp", "run", str(job)], cwd=cwd,
                          env=clean_env(), capture_output=True, text=True, timeout=300)


def test_job_files_load_and_name_their_scripts() -> None:
    """jobs/cifar10.yaml and jobs/infer.yaml pass the launcher's validation and run their scripts."""
    for name in ("cifar10", "infer"):
        job = load_job(JOBS / f"{name}.yaml")
        assert job.script_path() == str(JOBS / f"{name}.py")


@pytest.mark.slow
def test_cifar10_then_infer_under_the_launcher_write_checkpoint_events_and_merged_output(
        tmp_path: Path) -> None:
    """`clusterddp run` trains cifar10 (checkpoint + TensorBoard events), then infer merges shards."""
    train = _job_copy(tmp_path, "cifar10", [
        "--epochs", "1", "--width", "8", "--synthetic-train", "256", "--synthetic-test", "64",
        "--data-dir", "data/cifar10", "--out-dir", "runs/cifar10"])
    proc = _launch(train, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "generated stand-in" in proc.stdout + proc.stderr
    assert "epoch 1/1: train loss" in proc.stdout + proc.stderr
    assert (tmp_path / "runs/cifar10/checkpoints/last.pt").is_file()
    assert list((tmp_path / "runs/cifar10/tensorboard").glob("events.out.tfevents.*"))

    infer = _job_copy(tmp_path, "infer", [
        "--checkpoint", "runs/cifar10/checkpoints/last.pt", "--width", "8",
        "--synthetic-test", "65", "--out-dir", "runs/infer"])
    proc = _launch(infer, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs/infer/predictions.jsonl").open()]
    assert [r["index"] for r in rows] == list(range(65))
    assert len(list((tmp_path / "runs/infer/shards").glob("predictions.rank*.jsonl"))) == 2


def test_cifar10_amp_flag_accepts_modes_and_a_bare_flag_means_auto() -> None:
    """`--amp` alone is auto (the old switch), `--amp bf16|fp16|off` choose, default is off."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cifar10_job", JOBS / "cifar10.py")
    job = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(job)  # type: ignore[union-attr]
    assert [job.parse_args(argv).amp for argv in ([], ["--amp"], ["--amp", "bf16"],
                                                  ["--amp", "fp16", "--epochs", "1"])] \
        == ["off", "auto", "bf16", "fp16"]
    with pytest.raises(SystemExit):
        job.parse_args(["--amp", "fp8"])
