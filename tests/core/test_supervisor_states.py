"""The local supervisor's named states (issue 36, goal 2): the moves it makes in a real run,
and the moves it may not make."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clusterddp.launch.supervise.states import MOVES, Lifecycle, State
from tests.conftest import BIN

SUPERVISE = textwrap.dedent("""
    import json, sys
    from clusterddp.launch.supervise.supervisor import LocalSupervisor, SupervisorOptions
    from clusterddp.launch.start.workerenv import WorkerEnv
    from clusterddp.launch.start.workers import WorkerPlan
    from clusterddp.topology import Topology

    out, script, restarts, fail_below = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    topo = Topology(env="local", nnodes=1, node_rank=0, nproc_per_node=2, master_addr="127.0.0.1",
                    master_port=29500, run_id="t", backend="gloo", host="testhost")
    plans = [WorkerPlan(local_rank=r, rank=r, argv=(sys.executable, script, out, fail_below),
                        env=WorkerEnv(topo, r, launcher={"PATH": "/usr/bin:/bin"}), cwd=out,
                        log=f"{out}/rank{r}.log", error_file=f"{out}/rank{r}.err") for r in range(2)]
    supervisor = LocalSupervisor(topo, plans, SupervisorOptions(job_name="t", grace_period=1, restarts=restarts))
    code = supervisor.run()
    print(json.dumps([code, [s.value for s in supervisor.lifecycle.passed]]))
""")


def _states(tmp_path: Path, restarts: int, fail_below: int) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-c", SUPERVISE, str(tmp_path), str(BIN / "record_attempts.py"),
                           str(restarts), str(fail_below)], capture_output=True, text=True, timeout=600)
    code, passed = json.loads(done.stdout.splitlines()[-1])
    return code, passed


def test_a_failed_attempt_is_judged_backed_off_and_run_again(tmp_path: Path) -> None:
    """Attempt 0 fails (exit 3), attempt 1 succeeds: every state in order, once per attempt."""
    code, passed = _states(tmp_path, restarts=1, fail_below=1)
    assert code == 0
    assert passed == ["starting", "running", "stopping", "judging", "backing_off",
                      "running", "stopping", "judging", "finished"]


def test_a_failure_with_no_restarts_left_finishes_after_judging(tmp_path: Path) -> None:
    code, passed = _states(tmp_path, restarts=0, fail_below=1)
    assert code == 3
    assert passed == ["starting", "running", "stopping", "judging", "finished"]


@pytest.mark.parametrize("before, after", [(State.RUNNING, State.JUDGING), (State.STARTING, State.FINISHED),
                                           (State.JUDGING, State.RUNNING), (State.FINISHED, State.RUNNING),
                                           (State.BACKING_OFF, State.AWAITING_WORD)])
def test_a_move_not_in_the_table_is_refused(before: State, after: State) -> None:
    """A loop that skips a state (runs again without judging, ends without tearing down) is a bug: raised where it happens."""
    lifecycle = Lifecycle()
    lifecycle.state = before
    with pytest.raises(RuntimeError, match=f"from {before.value} to {after.value}"):
        lifecycle.enter(after)


def test_every_state_is_reachable_and_every_state_can_finish() -> None:
    reached, frontier = {State.STARTING}, [State.STARTING]
    while frontier:
        for nxt in MOVES[frontier.pop()] - reached:
            reached.add(nxt)
            frontier.append(nxt)
    assert reached == set(State)
    for state in State:
        seen, frontier = {state}, [state]
        while frontier:
            for nxt in MOVES[frontier.pop()] - seen:
                seen.add(nxt)
                frontier.append(nxt)
        assert State.FINISHED in seen, state
