"""hang_timeout: auto tells a hang from unannounced work by the stacks (hang.unannounced_work):
a stall with no rank in a collective is work (a final evaluation, a save, the exit), not a hang."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from clusterddp.hang import WORK_BUDGET, unannounced_work
from clusterddp.stackreport import RankWhere
from tests.conftest import cli, write_job


def _where(*waiting: bool) -> dict[int, RankWhere]:
    return {rank: RankWhere(summary="in f (x.py:1)", key=(), in_collective=w) for rank, w in enumerate(waiting)}


@pytest.mark.parametrize("where, work", [
    (_where(False, False), True),   # every rank does its own work
    (_where(True, False), False),   # one waits for the other: a hang once the budget ran out
    (_where(True, True), False),    # all wait in collectives that cannot complete
    ({}, False),                    # no stacks read: unknown, the budget decides as before
])
def test_unannounced_work_rule(where: dict[int, RankWhere], work: bool) -> None:
    """The rule: stacks read and no rank in a collective is work; anything else is not."""
    assert unannounced_work(where) is work


def _final_eval(job_dir: Path, run_id: str, *args: str) -> tuple[int, str, list[dict[str, object]], float]:
    job = write_job(job_dir, script="final_eval.py", hang_timeout="auto", grace_period=1, args=list(args))
    began = time.monotonic()
    result = cli("run", str(job), "--run-id", run_id, timeout=600)
    events = [json.loads(line) for line in (job_dir / "logs" / run_id / "events.jsonl").read_text().splitlines()]
    return result.returncode, result.stderr, events, time.monotonic() - began


def test_final_evaluation_after_the_steps_is_not_a_hang(job_dir: Path) -> None:
    """30 fast steps, then an unannounced 8 s evaluation on both ranks, a barrier, the exit: exit 0, one line."""
    code, stderr, events, _ = _final_eval(job_dir, "eval", "eval=8")
    assert code == 0, stderr
    assert "hang:" not in stderr
    said = [line for line in stderr.splitlines() if "unannounced work" in line]
    assert len(said) == 1 and f"allows it up to {WORK_BUDGET:.0f}s" in said[0], stderr
    work = [e for e in events if e["kind"] == "unannounced_work"]
    assert len(work) == 1 and work[0]["ranks"] == {"0": "in evaluate (final_eval.py:25)",
                                                   "1": "in evaluate (final_eval.py:25)"}
    assert [e["name"] for e in events if e["kind"] == "phase"] == ["exit", "exit"]  # the bootstrap's ending


def test_rank_stuck_outside_a_collective_is_still_a_hang(job_dir: Path) -> None:
    """After the steps rank 1 sleeps outside any collective, rank 0 waits in all_reduce: exit 124 naming rank 1."""
    code, stderr, events, _ = _final_eval(job_dir, "stuck", "mode=stuck")
    assert code == 124, stderr
    assert re.search(r"hang: no step on any rank for \d+s \(hang_timeout auto: 5s, .*\); stuck: rank 1 on \S+ "
                     r"in phase train", stderr), stderr
    assert not [e for e in events if e["kind"] == "unannounced_work"]


def test_every_rank_in_a_collective_that_cannot_complete_is_a_hang(job_dir: Path) -> None:
    """Both ranks wait in all_reduce on different groups: exit 124, saying their collectives cannot match."""
    code, stderr, _, _ = _final_eval(job_dir, "cross", "mode=cross")
    assert code == 124, stderr
    assert "rank(s) 0-1 on" in stderr and "all wait in a collective (phase train): no rank holds them" in stderr


@pytest.mark.slow
def test_twenty_final_evaluations_trip_nothing(job_dir: Path) -> None:
    """CDDP_CLEAN_RUNS (3; 20 measured in docs/diagnose.md) runs of the 8 s unannounced final evaluation: every one exits 0, no hang line."""
    runs = int(os.environ.get("CDDP_CLEAN_RUNS", "3"))
    outcomes = []
    for n in range(runs):
        code, stderr, events, took = _final_eval(job_dir, f"clean{n}", "eval=8")
        outcomes.append((code, "hang:" in stderr, sum(e["kind"] == "unannounced_work" for e in events), round(took, 1)))
    print(f"\n{runs} runs (exit code, hang line, unannounced_work events, seconds): {outcomes}")
    assert all(code == 0 and not hang for code, hang, _, _ in outcomes), outcomes
