"""The SSH head's loop as named states (launch/ssh/fanout.py: ``HeadState``, ``TRANSITIONS``):
the table itself, and the path a real run on sshd hosts takes through it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from clusterddp.launch.ssh.attempt import FanoutOptions, launch_of
from clusterddp.launch.ssh.fanout import TRANSITIONS, HeadLoop, HeadState, IllegalTransition, transition
from clusterddp.spec import load_job
from tests.ssh.conftest import write_job
from tests.testbed import SSHLab

S = HeadState


def _reachable(start: HeadState | None) -> set[HeadState]:
    seen: set[HeadState] = set()
    todo = list(TRANSITIONS[start])
    while todo:
        state = todo.pop()
        if state not in seen:
            seen.add(state)
            todo.extend(TRANSITIONS[state])
    return seen


def test_every_state_is_reached_and_every_state_can_end() -> None:
    """The loop starts by probing, reaches every state, can end from each, and nothing follows ENDED."""
    assert TRANSITIONS[None] == {S.PROBING}
    assert _reachable(None) == set(HeadState)
    assert all(S.ENDED in _reachable(state) for state in HeadState if state is not S.ENDED)
    assert TRANSITIONS[S.ENDED] == frozenset()


@pytest.mark.parametrize("current, new", [(None, S.RUNNING), (S.RUNNING, S.PROBING), (S.RUNNING, S.ENDED),
                                          (S.PROBING, S.RESUMING), (S.ENDED, S.PROBING),
                                          (S.JUDGING, S.RESUMING)])
def test_an_illegal_transition_raises(current: HeadState | None, new: HeadState) -> None:
    """A step the table does not list is a bug in the loop: it raises, naming both states."""
    with pytest.raises(IllegalTransition, match=new.name):
        transition(current, new)


def test_a_legal_transition_is_the_new_state() -> None:
    """``transition`` answers the state it allowed."""
    assert transition(S.JUDGING, S.BACKING_OFF) is S.BACKING_OFF


#: Attempt 0: rank 1 fails at once, rank 0 waits until the head ends the attempt; later: all succeed.
FAIL_ONE_WAIT_OTHER = """import os, sys, time
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
print(f"rank {rank} attempt {attempt}", flush=True)
if attempt == "0":
    if rank == "1":
        sys.exit(3)
    time.sleep(600)
"""

#: Attempt 0: rank 0 finishes; rank 1 fails once node 0's launcher has ended its run; later: all succeed.
FINISH_ONE_FAIL_OTHER = """import os, sys, time
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
print(f"rank {rank} attempt {attempt}", flush=True)
if attempt == "0" and rank == "1":
    events = os.path.join("logs", "states", "events.node0.jsonl")
    while not (os.path.exists(events) and '"run_end"' in open(events).read()):
        time.sleep(0.05)
    sys.exit(3)
"""


def _run(lab: SSHLab, tmp_path: Path, script: Path) -> tuple[HeadLoop, int, str]:
    """``script`` on the lab's hosts (1 worker each, restarts: 1) by a head loop in this process."""
    path = write_job(lab, str(script), nproc=1)
    path.write_text(path.read_text() + "restarts: 1\n")
    out, err = io.BytesIO(), io.BytesIO()
    options = FanoutOptions(hostfile=str(lab.hostfile), run_id="states", cwd=str(tmp_path), stdout=out, stderr=err)
    loop = HeadLoop(launch_of(load_job(str(path)), options))
    code = loop.run()
    return loop, code, (out.getvalue() + err.getvalue()).decode(errors="replace")


@pytest.mark.ssh
@pytest.mark.slow
def test_a_failed_attempt_restarted_in_place_goes_through_the_states_in_order(
        lab2: SSHLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 fails in attempt 0 while rank 0 runs (restarts: 1): probed, run, judged, both
    launchers kept waiting through the backoff, resumed in place, run again, judged, released
    (none waits any more), ended with 0."""
    monkeypatch.chdir(tmp_path)  # the head's logs/<run-id>/ lands here
    script = tmp_path / "fail_one_wait_other.py"
    script.write_text(FAIL_ONE_WAIT_OTHER)
    loop, code, said = _run(lab2, tmp_path, script)
    assert code == 0, said
    assert "in place (the same launchers)" in said, said
    assert loop.trace == [S.PROBING, S.RUNNING, S.JUDGING, S.BACKING_OFF, S.RESUMING, S.RUNNING, S.JUDGING,
                          S.RELEASING, S.ENDED], said
    assert lab2.wait_clean(5)[0]


@pytest.mark.ssh
@pytest.mark.slow
def test_a_failed_attempt_launched_anew_goes_through_the_states_in_order(
        lab2: SSHLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 fails in attempt 0 after rank 0 finished (restarts: 1): rank 0's launcher does not
    wait, so the waiting one is released before the backoff and attempt 1 is probed anew."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "finish_one_fail_other.py"
    script.write_text(FINISH_ONE_FAIL_OTHER)
    loop, code, said = _run(lab2, tmp_path, script)
    assert code == 0, said
    assert "in place" not in said, said
    assert loop.trace == [S.PROBING, S.RUNNING, S.JUDGING, S.RELEASING, S.BACKING_OFF, S.PROBING, S.RUNNING,
                          S.JUDGING, S.RELEASING, S.ENDED], said
    assert lab2.wait_clean(5)[0]
