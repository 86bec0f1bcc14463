"""The slow host named and hang_timeout: auto, from the ranks' progress files (issue 26, goals 2 and 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clusterddp.hang import FLOOR, PHASE_BUDGET, START_BUDGET, StepBudget
from clusterddp.progress import RankProgress
from clusterddp.straggler import StragglerWatch
from tests.conftest import cli, write_job


def _record(rank: int, t: float, compute: float | None, phase: str = "train", phase_t: float = 0.0,
            step_s: float = 0.2) -> RankProgress:
    return RankProgress(rank=rank, step=int(t * 10), t=t, steps=5, step_s=step_s, compute_s=compute, phase=phase,
                        phase_t=phase_t, mtime=t)


def test_straggler_named_after_three_slow_records_once() -> None:
    """One rank at 2x the others' compute for 3 records is named once, with its ratio."""
    watch = StragglerWatch()
    hosts = {0: "a", 1: "b", 2: "c", 3: "d"}
    found = []
    for second in range(1, 8):
        found += watch.observe([_record(r, second, 0.2 if (r == 2 and second >= 3) else 0.1) for r in range(4)],
                               hosts)
    assert [f.line() for f in found] == ["straggler: host c (rank 2) 2.0x the median step compute"]


def test_straggler_ignores_phase_windows_and_equal_step_times() -> None:
    """A checkpointing rank is not a straggler; without compute_s, equal step times name nobody."""
    watch = StragglerWatch()
    hosts = {r: f"h{r}" for r in range(4)}
    found = []
    for second in range(1, 10):
        ckpt = second % 3 == 0
        found += watch.observe([_record(r, second, 5.0 if r == 0 and ckpt else 0.1,
                                        phase="checkpoint" if r == 0 and ckpt else "train",
                                        phase_t=second - 0.5 if r == 0 and (ckpt or second % 3 == 1) else 0.0)
                                for r in range(4)], hosts)
        found += StragglerWatch().observe([_record(r, second, None) for r in range(4)], hosts)
    assert found == []


def test_step_budget_floor_p99_and_phases() -> None:
    """Fast steps: the 5 s floor; 3 s steps: 4x them; a phase: its own budget."""
    budget = StepBudget()
    for second in range(1, 20):
        budget.observe([_record(0, float(second), 0.1)])
    assert budget.budget(["train"])[0] == FLOOR
    for n in range(20, 200):
        budget.observe([_record(0, 20 + 3.0 * n, 0.1)])
    assert 12.0 <= budget.budget(["train"])[0] <= 12.0 * 1.06
    assert budget.budget(["train", "checkpoint"])[0] == PHASE_BUDGET


def test_slow_rank_named_within_10s_and_recorded(job_dir: Path) -> None:
    """4 ranks, rank 2 computes 2x from step 20: one straggler line within 10 s, and its event."""
    job = write_job(job_dir, script="slow_compute.py", nproc_per_node=4,
                    args=["steps=60", "compute=0.1", "slow_rank=2", "slow_from=20"])
    result = cli("run", str(job), "--run-id", "slow")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "straggler:" in line]
    assert len(lines) == 1 and re.search(r"straggler: host \S+ \(rank 2\) [12]\.\dx the median step compute", lines[0])
    onset = float(re.search(r"slow from step 20 t=([0-9.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    events = [json.loads(line) for line in (job_dir / "logs" / "slow" / "events.jsonl").read_text().splitlines()]
    found = [e for e in events if e["kind"] == "straggler"]
    assert len(found) == 1 and found[0]["ranks"] == [2]
    assert found[0]["t"] - onset < 10.0


def test_auto_hang_budget_lets_a_30x_checkpoint_pass_and_names_nobody(job_dir: Path) -> None:
    """hang_timeout: auto with checkpoints 30x a step and evaluations: no hang, no straggler."""
    job = write_job(job_dir, script="slow_compute.py", nproc_per_node=4, hang_timeout="auto",
                    args=["steps=12", "compute=0.25", "ckpt_every=6", "ckpt_x=30"])
    result = cli("run", str(job))
    assert result.returncode == 0, result.stderr
    assert "straggler" not in result.stderr and "hang" not in result.stderr


def test_auto_hang_names_the_stuck_rank_its_host_and_phase(job_dir: Path) -> None:
    """hang_timeout: auto, rank 3 stuck at step 30: exit 124 within seconds, naming rank 3 in phase train."""
    job = write_job(job_dir, script="slow_compute.py", nproc_per_node=4, hang_timeout="auto", grace_period=1,
                    args=["steps=1000", "compute=0.05", "stuck_rank=3", "stuck_at=30"])
    result = cli("run", str(job))
    assert result.returncode == 124, result.stderr
    assert re.search(r"hang: no step on any rank for \d+s \(hang_timeout auto: 5s, .*\); stuck: rank 3 on \S+ "
                     r"in phase train", result.stderr), result.stderr
    # Both clocks named (issue 32, item 15): "for 11s" was the time in the phase, read as the stall.
    clocks = re.search(r"stuck: rank 3 on \S+ in phase train \(entered (\d+)s ago\), no step for (\d+)s "
                       r"\(last step recorded \d+\)", result.stderr)
    assert clocks, result.stderr
    assert int(clocks[1]) >= int(clocks[2]), result.stderr  # the phase began before its last step


@pytest.mark.parametrize("value, problem", [("sometimes", "expected a number or one of 'auto'"),
                                            ("0", "must be > 0")])
def test_bad_hang_timeout_is_one_line_naming_file_line_field(job_dir: Path, value: str, problem: str) -> None:
    """A bad hang_timeout: one line naming file:line: hang_timeout, exit 2."""
    job = write_job(job_dir, script="slow_compute.py")
    job.write_text(job.read_text() + f"hang_timeout: {value}\n")
    result = cli("run", "--dry-run", str(job))
    assert result.returncode == 2
    assert re.fullmatch(rf"clusterddp: error: {re.escape(str(job))}:\d+: hang_timeout: {problem}.*\n",
                        result.stderr), result.stderr


def test_start_budget_is_documented() -> None:
    """The start-up budget the docs state is the one the code uses."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "diagnose.md").read_text()
    assert f"{START_BUDGET:g} s" in text and f"{PHASE_BUDGET:g} s" in text
