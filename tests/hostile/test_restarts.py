"""Local restarts hold their promises under faults: the backoff is waited out whatever wakes
the launcher (its children's SIGCHLD among them), a stop signal during it stops at once, and a
hang is a failure like any other, restarted on one node as over SSH. Real processes (tests/bin)."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.conftest import cli, start_cli, write_job


def _starts(directory: Path, rank: int) -> list[tuple[int, float]]:
    """(TORCHELASTIC_RESTART_COUNT, wall time) of every start of ``rank``, in order."""
    lines = (directory / f"starts{rank}").read_text().split("\n")
    return [(int(a), float(t)) for a, t in (line.split() for line in lines if line)]


def _attempt_starts(directory: Path) -> dict[int, float]:
    """The first stamp of each attempt over both ranks. A rank stopped by the teardown of its
    failing peer may not have written its own, on a loaded machine in no attempt at all: then
    its file does not exist (the flaky FileNotFoundError of issue 23), and it counts as no stamps."""
    starts: dict[int, float] = {}
    for rank in (0, 1):
        if not (directory / f"starts{rank}").exists():
            continue
        for attempt, at in _starts(directory, rank):
            starts[attempt] = min(at, starts.get(attempt, at))
    return starts


def test_the_backoff_between_restarts_is_waited_out(tmp_path: Path) -> None:
    """restarts: 2, every attempt fails at once: attempt 2 starts at once, attempt 3 >= 1 s after attempt 2."""
    job = write_job(tmp_path, script="attempt_stamp.py", args=[str(tmp_path), "fail"], restarts=2,
                    grace_period=1)
    result = cli("run", str(job), timeout=600)
    assert result.returncode == 3, result.stderr
    assert "in 0s (restart 1 of 2)" in result.stderr and "in 1s (restart 2 of 2)" in result.stderr
    starts = _attempt_starts(tmp_path)
    assert sorted(starts) == [0, 1, 2]
    gaps = [starts[1] - starts[0], starts[2] - starts[1]]
    assert gaps[1] >= 1.0, f"gaps between starts: {gaps}"


def test_a_stop_signal_during_the_backoff_stops_at_once(tmp_path: Path) -> None:
    """SIGTERM during a 4 s backoff: the launcher exits 143 and starts no new attempt (how soon:
    benchmarks/, not a test on a loaded machine)."""
    job = write_job(tmp_path, script="attempt_stamp.py", args=[str(tmp_path), "fail"], restarts=5,
                    grace_period=1)
    proc = start_cli("run", str(job))
    assert proc.stderr is not None
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "in 4s (restart 4 of 5)" in line:
                break
        else:
            raise AssertionError("no 4 s backoff announced:\n" + "".join(seen))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + err
    assert "SIGTERM before the restart: not restarting" in err
    assert sorted(_attempt_starts(tmp_path)) == [0, 1, 2, 3]


def test_a_hang_is_restarted_on_one_node(tmp_path: Path) -> None:
    """hang_timeout and restarts: 1, a hang on attempt 0: one restart, the workers see TORCHELASTIC_RESTART_COUNT=1, exit 0, one line per attempt."""
    # hang_timeout: long enough that attempt 1's start (its first line) never looks like a hang on a loaded machine
    job = write_job(tmp_path, script="attempt_stamp.py", args=[str(tmp_path), "hang-once"], restarts=1,
                    hang_timeout=10, grace_period=1)
    result = cli("run", str(job), timeout=600)
    assert result.returncode == 0, result.stderr
    restart_lines = [line for line in result.stderr.splitlines() if "restarting the local group" in line]
    assert len(restart_lines) == 1 and "hang: no rank made progress" in restart_lines[0], result.stderr
    assert "(restart 1 of 1)" in restart_lines[0]
    for rank in (0, 1):
        assert [a for a, _ in _starts(tmp_path, rank)] == [0, 1]
        assert f"rank {rank} attempt 1" in result.stdout
    assert "clusterddp: 2 attempts:" in result.stderr, result.stderr
    summary = result.stderr.split("clusterddp: 2 attempts:", 1)[1].splitlines()
    assert "attempt 1:" in summary[1] and "exit 124" in summary[1] and "hang: no rank made progress" in summary[1]
    assert "attempt 2:" in summary[2] and "finished" in summary[2]


def test_a_hang_on_every_attempt_exits_124_after_the_restarts(tmp_path: Path) -> None:
    """A job that hangs every time (restarts: 1): restarted once, then exit 124 with the hang named."""
    job = write_job(tmp_path, script="hang.py", args=[str(tmp_path)], restarts=1, hang_timeout=1.5,
                    grace_period=1)
    result = cli("run", str(job), timeout=600)
    assert result.returncode == 124, result.stderr
    assert result.stderr.count("restarting the local group") == 1, result.stderr
    assert "stopped: hang: no rank made progress" in result.stderr
