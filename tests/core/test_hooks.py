"""Diagnostics as hooks (launch/supervise/diagnostics.py): plain data in, a stop reason out; the
supervisor calls them and acts on what they answer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Sequence

from clusterddp.launch.supervise.diagnostics import HangCheck, StacksDump
from clusterddp.launch.start.workers import RankState
from clusterddp.protocol import STACKS_REQUEST_SIGNAL
from clusterddp.stackreport import StacksReport
from tests.conftest import BIN, REPO, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _rank(rank: int, last_line_at: float = 0.0, exited: bool = False) -> RankState:
    return RankState(rank=rank, pid=1, running=not exited, exited=exited, last_line_at=last_line_at,
                     stacks_file=None, heartbeat_file=None)


def _no_stacks(ranks: Sequence[RankState], why: str) -> StacksReport | None:
    return None


def test_hang_clock_starts_at_the_first_sign_of_life() -> None:
    """Silent ranks never hang while all are starting; after a first line the clock runs."""
    clock = Clock()
    check = HangCheck(5.0, _no_stacks, clock)
    clock.now += 60
    assert check([_rank(0), _rank(1)]) is None  # importing torch on a busy node is no hang
    assert check([_rank(0, last_line_at=clock.now), _rank(1)]) is None
    clock.now += 4
    assert check([_rank(0, last_line_at=clock.now - 4), _rank(1)]) is None
    clock.now += 2
    reason = check([_rank(0, last_line_at=clock.now - 6), _rank(1)])
    assert reason is not None and reason.startswith("hang: no rank made progress for 6s (hang_timeout 5s); ")


def test_hang_check_asks_for_stacks_and_new_attempt_resets() -> None:
    """A hang asks the stacks hook with why='hang'; a new attempt starts the clock again."""
    clock = Clock()
    asked: list[str] = []

    def stacks(ranks: Sequence[RankState], why: str) -> StacksReport | None:
        asked.append(why)
        return None

    check = HangCheck(1.0, stacks, clock)
    assert check([_rank(0, exited=True), _rank(1)]) is None  # an exit is a sign of life
    clock.now += 2
    assert check([_rank(0, exited=True), _rank(1)]) is not None and asked == ["hang"]
    check.new_attempt()
    assert check([_rank(0), _rank(1)]) is None


def test_no_hang_timeout_means_no_check() -> None:
    """Without hang_timeout the hook never answers a reason."""
    clock = Clock()
    check = HangCheck(None, _no_stacks, clock)
    check([_rank(0, last_line_at=clock.now)])
    clock.now += 10_000
    assert check([_rank(0, last_line_at=1.0)]) is None


def test_stacks_dump_without_live_targets_says_nothing() -> None:
    """Ranks that exited or have no stacks file are not asked; nothing is printed."""
    said: list[str] = []
    dump = StacksDump("h", None, said.append, said.append)
    ranks = [_rank(0, exited=True), RankState(1, 1, True, False, 0.0, None, None)]
    assert dump(ranks, "requested") is None and said == []


SUPERVISE = textwrap.dedent("""
    import json, sys
    from clusterddp.launch.supervise.diagnostics import DiagnosticHooks
    from clusterddp.launch.supervise.supervisor import LocalSupervisor, SupervisorOptions
    from clusterddp.launch.start.workerenv import WorkerEnv
    from clusterddp.launch.start.workers import WorkerPlan
    from clusterddp.topology import Topology

    out, hang_after = sys.argv[1], int(sys.argv[2])
    calls = []
    def record(kind, ranks, why=None):
        calls.append(kind)
        with open(out + "/calls.jsonl", "a") as f:
            f.write(json.dumps([kind, why, [r.rank for r in ranks]]) + "\\n")
    def hang(ranks):
        record("hang", ranks)
        return "hang: told by the test hook" if calls.count("hang") > hang_after else None
    hooks = DiagnosticHooks(stacks=lambda ranks, why: record("stacks", ranks, why),
                            hang=hang, new_attempt=lambda: record("new_attempt", []))
    topo = Topology(env="local", nnodes=1, node_rank=0, nproc_per_node=2, master_addr="127.0.0.1",
                    master_port=29500, run_id="t", backend="gloo", host="testhost")
    plans = [WorkerPlan(local_rank=r, rank=r, argv=(sys.executable, sys.argv[3], out),
                        env=WorkerEnv(topo, r, launcher={"PATH": "/usr/bin:/bin"}), cwd=out,
                        log=f"{out}/rank{r}.log", error_file=f"{out}/rank{r}.err") for r in range(2)]
    sys.exit(LocalSupervisor(topo, plans, SupervisorOptions(job_name="t", grace_period=1), hooks).run())
""")


def _supervise(tmp_path: Path, hang_after: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SUPERVISE, str(tmp_path), str(hang_after), str(BIN / "hang.py")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _calls(tmp_path: Path) -> list[list[object]]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_supervisor_stops_with_hang_code_when_the_hang_hook_answers(tmp_path: Path) -> None:
    """The supervisor calls new_attempt, then hang on every tick; a reason stops it with exit 124."""
    proc = _supervise(tmp_path, hang_after=3)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 124, err
    assert "hang: told by the test hook" in err
    calls = _calls(tmp_path)
    assert calls[0][0] == "new_attempt"
    assert [c[0] for c in calls[1:]] == ["hang"] * 4 and calls[1][2] == [0, 1]


def test_stacks_request_signal_calls_the_stacks_hook(tmp_path: Path) -> None:
    """STACKS_REQUEST_SIGNAL to the launcher makes it call the stacks hook with 'requested'."""
    proc = _supervise(tmp_path, hang_after=10_000)
    try:
        assert wait_for(lambda: len(list(tmp_path.glob("rank*.pid"))) == 2)
        proc.send_signal(STACKS_REQUEST_SIGNAL)
        assert wait_for(lambda: any(c[0] == "stacks" for c in _calls(tmp_path)), timeout=20)
        assert [c for c in _calls(tmp_path) if c[0] == "stacks"][0][1:] == ["requested", [0, 1]]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM
