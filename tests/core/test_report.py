"""``clusterddp report``: timeline and goodput from the event log, parts adding up to the wall clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterddp.diagnose.goodput import breakdown, intervals
from tests.conftest import cli, cli_env, write_job


def _event(t: float, kind: str, attempt: int = 0, **fields: object) -> dict[str, object]:
    return {"t": t, "kind": kind, "node": None, "host": "h", "attempt": attempt, **fields}


def test_breakdown_of_a_run_with_a_restart() -> None:
    """Start-up to the first step, training, a checkpoint, the failure to the next first step, shut-down."""
    events = [
        _event(0.0, "run_start"), _event(0.0, "attempt_start"), _event(2.0, "first_step", at=2.0),
        _event(5.0, "phase", name="checkpoint", edge="span", at=4.0, until=5.0),
        _event(8.0, "attempt_end", exit_code=137, failed_at=7.0), _event(8.0, "restart"),
        _event(9.0, "attempt_start", 1), _event(11.0, "first_step", 1, at=11.0),
        _event(12.0, "phase", 1, name="eval", edge="start", at=12.0),
        _event(12.5, "phase", 1, name="eval", edge="end", at=12.5),
        _event(15.0, "attempt_end", 1, exit_code=0), _event(15.5, "run_end", 1, exit_code=0),
    ]
    parts = breakdown(intervals(events, 15.5), 0.0, 15.5)
    assert parts == pytest.approx({"start-up": 2.0, "training": 4.0 + 3.5, "checkpoints": 1.0,
                                   "restarts": 4.0, "evaluation": 0.5, "shut-down": 0.5})
    assert sum(parts.values()) == pytest.approx(15.5)


def test_hang_wait_counts_from_the_stall() -> None:
    """A hang's timeout before it, and its teardown, are hang waits, not training."""
    events = [_event(0.0, "run_start"), _event(0.0, "attempt_start"), _event(1.0, "first_step", at=1.0),
              _event(10.0, "hang", timeout_s=4.0), _event(11.0, "attempt_end", exit_code=124),
              _event(11.0, "run_end", exit_code=124)]
    parts = breakdown(intervals(events, 11.0), 0.0, 11.0)
    assert parts == pytest.approx({"start-up": 1.0, "training": 5.0, "hang waits": 5.0})


@pytest.mark.parametrize("hang", [False, True])
def test_report_of_a_real_run_with_a_restart(tmp_path: Path, hang: bool) -> None:
    """A real 2-worker run killed (or hung) once: the report's parts sum to its wall clock within 1%."""
    job = write_job(tmp_path, script="phased_steps.py", args=["10", "0.1"] + (["hang"] if hang else []),
                    restarts=1, cpu_affinity="none", **({"hang_timeout": 1.5} if hang else {}))
    done = cli("run", str(job), "--run-id", "r", env=cli_env())
    assert done.returncode == 0, done.stderr
    shown = cli("report", "--log-dir", str(tmp_path / "logs"))
    assert shown.returncode == 0, shown.stderr
    assert "goodput:" in shown.stdout and "first_step" in shown.stdout
    data = json.loads(cli("report", "r", "--log-dir", str(tmp_path / "logs"), "--json").stdout)
    parts = data["parts_s"]
    assert abs(sum(parts.values()) - data["wall_s"]) <= 0.01 * data["wall_s"]
    assert parts["training"] > 1.0 and parts["restarts"] > 0 and parts["start-up"] > 0  # a warm restart: ~0.2 s
    assert parts.get("checkpoints", 0) > 0.3 and parts.get("evaluation", 0) > 0.2
    assert (parts.get("hang waits", 0) > 1.5) == hang
    kinds = [e["kind"] for e in data["events"]]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and kinds.count("attempt_start") == 2


def test_report_of_no_run_is_one_line(tmp_path: Path) -> None:
    """No run under the log dir: one line, exit 2."""
    done = cli("report", "--log-dir", str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no run with an event log" in done.stderr


def test_redone_steps_are_lost_time_not_training() -> None:
    """A restarted attempt's steps up to the failed attempt's highest step are ``redone``."""
    events = [
        _event(0.0, "run_start", process_start=-0.5), _event(0.0, "attempt_start"),
        _event(2.0, "first_step", at=2.0),
        _event(8.0, "attempt_end", exit_code=137, failed_at=8.0),
        _event(9.0, "attempt_start", 1), _event(10.0, "first_step", 1, at=10.0),
        _event(12.0, "redone", 1, at=10.0, until=12.0, resumed_after=30, earlier_high=35),
        _event(15.0, "attempt_end", 1, exit_code=0), _event(15.0, "run_end", 1, exit_code=0),
    ]
    parts = breakdown(intervals(events, 15.0, -0.5), -0.5, 15.0)
    assert parts == pytest.approx({"start-up": 2.5, "training": 6.0 + 3.0, "restarts": 2.0,
                                   "redone": 2.0})


#: The ground-truth job: 120 steps of 0.05 s, a 0.4 s checkpoint after every 25th, attempt 0
#: killed after step 70 (its last checkpoint: step 50), a planned 1.5 s start sleep per attempt.
TRUTH_ARGS = {"steps": 120, "step_s": 0.05, "every": 25, "ckpt_s": 0.4, "kill_at": 70, "start_sleep": 1.5}


def test_report_matches_a_job_with_a_known_ground_truth(tmp_path: Path) -> None:
    """Every figure of the report within 2% of the wall clock of what the job did: useful
    training (120 x 0.05 s), redone (steps 51-70 again: 1.0 s), checkpoint stall (4 x 0.4 s),
    start-up and restart (each with its 1.5 s sleep), from the CLI's own start; ETTR within 0.02."""
    a = TRUTH_ARGS
    state, truth = tmp_path / "state", tmp_path / "truth.jsonl"
    job = write_job(tmp_path, script="ground_truth.py", nproc_per_node=1, restarts=1,
                    cpu_affinity="none",
                    args=[str(a[k]) for k in ("steps", "step_s", "every", "ckpt_s", "kill_at", "start_sleep")]
                    + [str(state), str(truth)])
    env = cli_env()
    began = __import__("time").time()
    done = cli("run", str(job), "--run-id", "truth", env=env)
    ended = __import__("time").time()
    assert done.returncode == 0, done.stderr
    facts = [json.loads(line) for line in truth.read_text().splitlines()]
    begins = {f["attempt"]: f for f in facts if f["fact"] == "training_begins"}
    killed = next(f for f in facts if f["fact"] == "killed")
    finished = next(f for f in facts if f["fact"] == "done")
    assert begins[1]["resumed"] == 50
    expected = {
        "training": a["steps"] * a["step_s"],
        "redone": (a["kill_at"] - 50) * a["step_s"],
        "checkpoint stall": 4 * a["ckpt_s"],
        "start-up": begins[0]["t"] - began,
        "restart": begins[1]["t"] - killed["t"],
        "shut-down": ended - finished["t"],
    }
    data = json.loads(cli("report", "truth", "--log-dir", str(tmp_path / "logs"), "--json").stdout)
    wall = ended - began
    figures = {"training": data["parts_s"]["training"], **data["lost_s"]}
    tolerance = 0.02 * wall
    print(f"wall clock: report {data['wall_s']:.3f}s, truth {wall:.3f}s (launcher process start to exit)")
    for name, value in expected.items():
        print(f"{name}: report {figures[name]:.3f}s, truth {value:.3f}s")
    print(f"ETTR: report {data['ettr']:.4f}, truth {expected['training'] / wall:.4f}")
    assert abs(data["wall_s"] - wall) <= tolerance
    for name, value in expected.items():
        assert abs(figures[name] - value) <= tolerance, (name, figures[name], value, tolerance)
    assert figures["hang wait"] == 0.0
    assert abs(data["ettr"] - expected["training"] / wall) <= 0.02
