"""Restarts in place under SLURM, node 0 deciding through the step's directory (launch/restart/stepcoord.py):
real files, the launchers' sides in threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from clusterddp.launch.restart.coordinate import AttemptEnded, Restart
from clusterddp.launch.observe.peers import SharedRunDir
from clusterddp.launch.observe.exits import WorkerExit
from clusterddp.launch.restart.stepcoord import StepCoordinator
from clusterddp.protocol import attempt_end_name as end_name, decision_name
from clusterddp.launch.restart.verdict import failure_of
from clusterddp.spec import RestartOnSpec
from tests.core.test_peers import Clock, node


def coordinators(tmp_path: Path, restarts: int = 2, nnodes: int = 2) -> list[StepCoordinator]:
    """One coordinator per node, the nodes' markers found and acknowledged."""
    clock, said = Clock(), []
    peers: list[SharedRunDir] = [node(tmp_path, n, clock, said, nnodes=nnodes) for n in range(nnodes)]
    for shared in peers:
        shared.poll(stepped=False)
    return [StepCoordinator(str(tmp_path), shared.topology, restarts, RestartOnSpec(), 0.5, shared, said.append)
            for shared in peers]


def killed(host: str, rank: int, at: float, progressed: bool = True) -> tuple[WorkerExit, AttemptEnded]:
    root = WorkerExit(host, rank, 0, 100 + rank, -9, "log", at=at)
    return root, AttemptEnded(0, 137, root, failure_of(137, "SIGKILL", ()), progressed, None)


def import_error(host: str, rank: int, at: float, attempt: int = 0) -> AttemptEnded:
    tail = ["Traceback (most recent call last):", '  File "/w/train.py", line 3, in <module>',
            "ModuleNotFoundError: No module named 'x'"]
    root = WorkerExit(host, rank, 0, 100 + rank, 1, "log", tail=tail, at=at)
    return AttemptEnded(attempt, 1, root, failure_of(1, None, tail), False, None)


def run_nodes(coords: list[StepCoordinator], ends: list[AttemptEnded | None]) -> list[Restart | None]:
    """Every node reports its end (None: that node's launcher is lost) at once; their answers."""
    answers: list[Restart | None] = [None] * len(coords)

    def one(i: int) -> None:
        ended = ends[i]
        if ended is not None:
            answers[i] = coords[i].next_attempt(ended, lambda: False)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(coords))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)  # ends as soon as they answer; a loaded machine may be slow
    assert not any(t.is_alive() for t in threads), "a node never answered"
    return answers


def test_a_killed_worker_restarts_every_node_in_place_on_one_new_port(tmp_path: Path) -> None:
    """Node 1's rank SIGKILLed, node 0 ended because of it: both get attempt 1 on the same new port."""
    zero, one = coordinators(tmp_path)
    assert zero.ended_elsewhere(0) is None
    _, ended = killed("n2", 2, time.time())
    answers = run_nodes([zero, one], [AttemptEnded(0, 1, None, None, True, None), ended])
    assert answers[0] is not None and answers[0] == answers[1] and answers[0].attempt == 1
    assert answers[0].master_port is not None
    assert not (tmp_path / "node0.failure").exists()
    assert (tmp_path / "node1.failure").read_text().split()[1:] == ["0", "restart", "SIGKILL"]


def test_a_peer_end_ends_this_nodes_attempt(tmp_path: Path) -> None:
    """Node 0 learns from node 1's end file that attempt 0 ended there, and why."""
    zero, _ = coordinators(tmp_path)
    (tmp_path / end_name(0, 1)).write_text('{"node": 1, "host": "n2", "failed_at": 1.0, "exit_code": 137, '
                                           '"failure": {"exit_code": 137, "signal": "SIGKILL"}, '
                                           '"progressed": true, "waits": true}')
    assert zero.ended_elsewhere(0) == "node 1 (n2) ended attempt 0: SIGKILL"
    time.sleep(0.03)  # looks at most every POLL s
    assert zero.ended_elsewhere(1) is None  # another attempt's file never counts


def test_the_first_failure_decides_and_a_repeat_is_final(tmp_path: Path) -> None:
    """An ImportError before progress on node 1 (first), a SIGKILL later on node 0: stop, final; every
    node's record says stop with the reason, the batch script restarts nothing either."""
    zero, one = coordinators(tmp_path)
    now = time.time()
    _, later = killed("n1", 0, now + 1, progressed=False)
    answers = run_nodes([zero, one], [later, import_error("n2", 2, now)])
    assert answers == [None, None]
    for n in (0, 1):
        words = (tmp_path / f"node{n}.failure").read_text().split(" ", 3)
        assert words[1:3] == ["0", "stop"], words
        assert words[3].startswith("ModuleNotFoundError at train.py:3 before any progress"), words


def test_restarts_used_up_or_a_lost_node_leave_it_to_the_batch_script(tmp_path: Path) -> None:
    """restarts: 1 after attempt 1, or a node that never reports: no restart in place, promptly."""
    zero, one = coordinators(tmp_path, restarts=0)
    _, ended = killed("n2", 2, time.time())
    assert run_nodes([zero, one], [AttemptEnded(0, 1, None, None, True, None), ended]) == [None, None]
    assert (tmp_path / "node1.failure").read_text().split()[2] == "restart"  # the script counts restarts
    lost = tmp_path / "lost"
    lost.mkdir()
    zero, one = coordinators(lost)
    assert run_nodes([zero, one], [AttemptEnded(0, 1, None, None, True, None), None]) == [None, None]
    assert '"restart": false' in (lost / decision_name(0)).read_text()


def test_a_node_not_acknowledged_does_not_wait(tmp_path: Path) -> None:
    """Node 1 never saw node 0's acknowledgement: it ends at once; node 0 stops the in-place restart."""
    zero, one = coordinators(tmp_path)
    one.peers = None
    _, ended = killed("n2", 2, time.time())
    assert run_nodes([zero, one], [AttemptEnded(0, 1, None, None, True, None), ended]) == [None, None]
    assert "do not wait for node 0" in (tmp_path / decision_name(0)).read_text()


def test_the_same_error_twice_before_progress_stops_after_one_restart_in_place(tmp_path: Path) -> None:
    """A RuntimeError at train.py:5 before any step: restarted in place once; the same again in attempt
    1 is final, naming attempt 0 (node 0 remembers the root cause it decided on)."""
    zero, one = coordinators(tmp_path)
    tail = ["Traceback (most recent call last):", '  File "/w/train.py", line 5, in <module>',
            "RuntimeError: no device"]

    def failed(attempt: int) -> AttemptEnded:
        root = WorkerExit("n2", 2, 0, 102, 1, "log", tail=tail, at=time.time())
        return AttemptEnded(attempt, 1, root, failure_of(1, None, tail), False, None)

    first = run_nodes([zero, one], [AttemptEnded(0, 1, None, None, False, None), failed(0)])
    assert first[0] is not None and first[0].attempt == 1
    for shared in (zero.peers, one.peers):  # attempt 1: the markers again
        assert shared is not None
        first_rank = shared.topology.node_rank * 2
        shared.attempt_started(1, [(r, str(tmp_path / f"rank{r}.heartbeat")) for r in (first_rank, first_rank + 1)])
    assert zero.peers is not None and zero.peers.sees_all() and one.peers is not None and one.peers.acknowledged()
    assert run_nodes([zero, one], [AttemptEnded(1, 1, None, None, False, None), failed(1)]) == [None, None]
    assert (tmp_path / "node1.failure").read_text().split(" ", 3)[2:] == [
        "stop", "the same RuntimeError at train.py:5 before any progress, as in attempt 0 (node 1, n2)\n"]


def test_one_node_restarts_in_place_alone(tmp_path: Path) -> None:
    """A 1-node job under the batch script (no peers to find): node 0 decides for itself at once."""
    (zero,) = coordinators(tmp_path, nnodes=1)
    zero.peers = None
    _, ended = killed("n1", 0, time.time())
    answer = zero.next_attempt(ended, lambda: False)
    assert answer is not None and answer.attempt == 1 and answer.master_port is not None
    assert (tmp_path / "node0.attempt").read_text() == "1\n"
