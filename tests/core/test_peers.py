"""Without a head, node 0 judges the nodes whose markers it finds in the run directory (launch/observe/peers.py)."""

from __future__ import annotations

import json
from pathlib import Path

from clusterddp import hang, progress
from clusterddp.launch.observe.peers import SharedRunDir, shared_run_dir
from clusterddp.protocol import PEERS_SEEN_FILE as SEES_FILE, peer_marker_name as marker_name
from clusterddp.stackreport import RankWhere
from clusterddp.topology import Topology


def topology(node: int, nnodes: int = 3, run_id: str = "42") -> Topology:
    return Topology(env="slurm", nnodes=nnodes, node_rank=node, nproc_per_node=2, master_addr="n1",
                    master_port=29500, run_id=run_id, backend="gloo", host=f"n{node + 1}",
                    hosts=tuple(f"n{i + 1}" for i in range(nnodes)))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(run_dir: Path, rank: int, clock: Clock, said: list[str], nnodes: int = 3, run_id: str = "42",
         attempt: int = 0) -> SharedRunDir:
    shared = SharedRunDir(str(run_dir), topology(rank, nnodes, run_id), said.append, clock)
    first = rank * 2
    shared.attempt_started(attempt, [(r, str(run_dir / f"rank{r}.heartbeat")) for r in (first, first + 1)])
    return shared


def test_node0_reads_the_markers_and_acknowledges_them(tmp_path: Path) -> None:
    """Node 0 takes nodes 1-2's record files and hosts; each finds its nonce in node0.sees and defers."""
    clock, said = Clock(), []
    zero, one, two = (node(tmp_path, n, clock, said) for n in range(3))
    for shared in (zero, one, two):
        shared.poll(stepped=False)
    assert sorted(zero.files) == [(r, str(tmp_path / f"rank{r}.heartbeat")) for r in (2, 3, 4, 5)]
    assert zero.hosts == {2: "n2", 3: "n2", 4: "n3", 5: "n3"}
    clock.now += 1.0
    one.poll(stepped=True)
    two.poll(stepped=True)
    assert one.judged_elsewhere and two.judged_elsewhere and not zero.judged_elsewhere
    clock.now += 60.0
    zero.poll(stepped=True)
    assert said == []


def test_node0_says_once_what_it_does_not_see(tmp_path: Path) -> None:
    """A node whose marker is elsewhere (no shared dir) judges its own ranks; node 0 says so once, after its ranks stepped."""
    clock, said = Clock(), []
    zero = node(tmp_path / "a", 0, clock, said, nnodes=2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = node(tmp_path / "b", 1, clock, said, nnodes=2)
    for _ in range(3):
        clock.now += 20.0
        zero.poll(stepped=clock.now > 1030.0)
        one.poll(stepped=True)
    assert zero.files == [] and not one.judged_elsewhere
    assert len(said) == 1 and "node 0 sees no progress file of node(s) 1 (n2)" in said[0], said
    assert "each node judges only its own ranks" in said[0]
    (tmp_path / "a" / marker_name(1)).write_text((tmp_path / "b" / marker_name(1)).read_text())
    clock.now += 1.0
    zero.poll(stepped=True)
    assert zero.hosts == {2: "n2", 3: "n2"} and "now also judges" in said[-1]


def test_markers_of_another_run_attempt_or_shape_are_not_taken(tmp_path: Path) -> None:
    """Another run id, another attempt, wrong ranks, an old marker or garbage: node 0 reads none of them."""
    clock, said = Clock(), []
    node(tmp_path, 1, clock, said, run_id="41")
    node(tmp_path, 2, clock, said, attempt=1)
    zero = node(tmp_path, 0, clock, said)
    zero.poll(stepped=False)
    assert zero.peers == {}
    for data in ({"run_id": "42", "attempt": 0, "node": 1, "host": "n2", "nonce": "x", "t": 1000.0,
                  "files": [[2, "rank2.heartbeat"], [7, "rank7.heartbeat"]]},
                 {"run_id": "42", "attempt": 0, "node": 1, "host": "n2", "nonce": "x", "t": 900.0,
                  "files": [[2, "rank2.heartbeat"], [3, "rank3.heartbeat"]]},
                 {"run_id": "42", "attempt": 0, "node": 1, "host": "n2", "nonce": "x", "t": 1000.0,
                  "files": [[2, "../rank2.heartbeat"], [3, "rank3.heartbeat"]]}):
        (tmp_path / marker_name(1)).write_text(json.dumps(data))
        clock.now += 1.0
        zero.poll(stepped=False)
        assert zero.peers == {}, data
    (tmp_path / marker_name(1)).write_bytes(b"\x00garbage")
    clock.now += 1.0
    zero.poll(stepped=False)
    assert zero.peers == {} and not (tmp_path / SEES_FILE).exists()


def test_only_headless_multi_node_launchers_share() -> None:
    """One node, or a launcher under the SSH head, or no run dir: no exchange."""
    assert shared_run_dir("/x", topology(0, nnodes=1), False, print) is None
    assert shared_run_dir("/x", topology(1), True, print) is None
    assert shared_run_dir(None, topology(1), False, print) is None
    assert shared_run_dir("/x", topology(1), False, print) is not None


def record(rank: int, step: int, mtime: float) -> progress.RankProgress:
    return progress.RankProgress(rank=rank, step=step, t=mtime, steps=1, step_s=0.1, compute_s=0.05,
                                 phase="train", phase_t=mtime - 50, mtime=mtime)


def test_stuck_names_the_rank_on_another_node_when_every_rank_here_waits() -> None:
    """Node 0's ranks all wait in a collective: the stuck rank is the furthest behind of the other nodes' records, with its host."""
    records = [record(0, 20, 100.0), record(1, 20, 100.0), record(2, 20, 100.2), record(3, 19, 99.0)]
    where = {0: RankWhere("in all_reduce", (), True), 1: RankWhere("in all_reduce", (), True)}
    line = hang.stuck(records, where, "n1", 108.0, {2: "n2", 3: "n2"})
    assert line == ("rank(s) 0-1 on n1 wait in a collective; stuck: rank 3 on n2 in phase train (entered 59s ago), "
                    "no step for 9s (last step recorded 19)")
    assert "on another node" in hang.stuck(records[:2], where, "n1", 108.0)
