"""``checkpoint_every="auto"``: Young/Daly from the measured stall and the run records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clusterddp.events import EventLog
from clusterddp.train.interval import History, choose, daly, read_history, young
from rankrun import REPO, clean_env

import subprocess
import sys

JOB = Path(__file__).resolve().parent / "bin" / "ckpt_job.py"


@pytest.mark.parametrize(("stall", "mtbf", "expected"), [
    (10.0, 3600.0 * 24, math.sqrt(2 * 10 * 86400)),  # Daly ~ Young when C << M
    (60.0, 3600.0, None),
    (5000.0, 2000.0, 2000.0),                           # C >= 2M: checkpoint every M
])
def test_daly_is_young_with_its_correction(stall: float, mtbf: float, expected: float | None) -> None:
    """Daly's interval: Young's sqrt(2CM) corrected; M itself when a checkpoint costs 2M."""
    got = daly(stall, mtbf)
    if expected is None:
        ratio = stall / (2 * mtbf)
        expected = young(stall, mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - stall
    assert got == pytest.approx(expected, rel=0.02)


def test_the_choice_is_clamped_to_the_bounds_and_made_steps() -> None:
    """Few failures push the interval to the maximum, many to the minimum; steps = s / step."""
    rare = choose(1.0, 0.5, History(failures=0, exposure_s=1e6, runs=1), 60.0, 600.0)
    assert (rare.interval_s, rare.every_steps) == (600.0, 1200) and "(the maximum)" in rare.line("j")
    often = choose(1.0, 0.5, History(failures=100, exposure_s=100.0, runs=1), 60.0, 600.0)
    assert (often.interval_s, often.every_steps) == (60.0, 120) and "(the minimum)" in often.line("j")
    mid = choose(2.0, 0.1, History(failures=3, exposure_s=4 * 900.0, runs=2), 1.0, 1e4)
    assert mid.interval_s == pytest.approx(daly(2.0, 900.0)) and mid.every_steps == round(mid.interval_s / 0.1)


def _run(logs: Path, run_id: str, job: str, attempts: list[tuple[float, float, int]]) -> None:
    (logs / run_id).mkdir(parents=True, exist_ok=True)
    log = EventLog(str(logs / run_id), None, "h")
    log.emit("run_start", job=job)
    for number, (began, ended, code) in enumerate(attempts):
        log.attempt = number
        log.emit("attempt_start")
        log.emit("attempt_end", exit_code=code)
    log.close()
    # the launcher's own times are now; place the attempts where the test says
    path = logs / run_id / "events.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    times = iter(t for a in attempts for t in a[:2])
    for event in lines:
        if event["kind"] in ("attempt_start", "attempt_end"):
            event["t"] = next(times)
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_history_reads_this_run_and_earlier_runs_of_the_same_job(tmp_path: Path) -> None:
    """Failures (exit codes other than 0 and 75) and attempt time over this run and the
    earlier runs of the same job name in the log directory; other jobs are left out."""
    logs = tmp_path / "logs"
    _run(logs, "old", "train", [(0.0, 100.0, 1), (110.0, 300.0, 0)])
    _run(logs, "other", "eval", [(0.0, 1000.0, 1)])
    _run(logs, "preempted", "train", [(0.0, 50.0, 75)])
    _run(logs, "now", "train", [(1000.0, 1200.0, 137)])
    with open(logs / "now" / "events.jsonl", "a") as f:  # the attempt running now
        f.write(json.dumps({"t": 1300.0, "kind": "attempt_start", "attempt": 1}) + "\n")
    history = read_history(str(logs / "now"), "train", now=1400.0)
    assert (history.failures, history.runs) == (2, 3)
    assert history.exposure_s == pytest.approx(100 + 190 + 50 + 200 + 100)
    assert read_history(None, "train") == History()


def test_auto_interval_under_the_launcher_is_said_and_reported(tmp_path: Path) -> None:
    """A real run with checkpoint_every auto and one failure: rank 0 says which interval it
    chose and why, the checkpoints follow it, and ``clusterddp report`` prints the choice."""
    import yaml
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "auto", "script": str(JOB), "nproc_per_node": 2, "restarts": 1,
        "cpu_affinity": "none", "grace_period": 2, "logs": {"dir": str(tmp_path / "logs")},
        "args": [str(tmp_path), "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every",
                 "auto", "--min-s", "0.3", "--max-s", "0.6", "--step-sleep", "0.03",
                 "--epochs", "8", "--job-name", "auto", "--fail-at", "15"]}))
    env = clean_env()
    done = subprocess.run([sys.executable, "-m", "clusterddp", "run", str(job), "--run-id", "a"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in (done.stdout + done.stderr).splitlines() if "checkpoint_every auto:" in line]
    assert said and "Young/Daly optimum" in said[-1] and "1 failure(s)" in said[-1], said
    shown = subprocess.run([sys.executable, "-m", "clusterddp", "report", "a", "--log-dir",
                            str(tmp_path / "logs")], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
    assert "checkpoint interval: checkpoint_every auto: every" in shown.stdout, shown.stdout[-2000:]
    data = json.loads(subprocess.run([sys.executable, "-m", "clusterddp", "report", "a", "--log-dir",
                                      str(tmp_path / "logs"), "--json"], cwd=REPO, env=env,
                                     capture_output=True, text=True, timeout=120).stdout)
    chosen = data["checkpoint_interval"]
    assert 0.3 <= chosen["interval_s"] <= 0.6 and chosen["failures"] == 1
