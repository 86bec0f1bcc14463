"""The doctor's arithmetic: pair schedule, nccl-tests bus bandwidth, per-node figures and flags."""

from __future__ import annotations

import itertools

import pytest

from clusterddp.launch.doctor import find_result
from clusterddp.netperf import (Measurements, PairTiming, allreduce_table, bus_factor, node_figures, node_table,
                                pair_rounds)
from clusterddp.protocol import DOCTOR_MARKER


@pytest.mark.parametrize("nnodes", [2, 3, 4, 5, 8, 9])
def test_pair_rounds_are_disjoint_and_meet_new_partners(nnodes: int) -> None:
    """Each round pairs a node at most once; over nnodes-1 rounds every pair meets exactly once."""
    rounds = pair_rounds(nnodes, limit=nnodes)
    for pairs in rounds:
        nodes = [n for pair in pairs for n in pair]
        assert len(nodes) == len(set(nodes))
    met = [pair for pairs in rounds for pair in pairs]
    assert sorted(met) == sorted(itertools.combinations(range(nnodes), 2))
    assert len(pair_rounds(nnodes, limit=3)) == min(3, nnodes - 1 if nnodes % 2 == 0 else nnodes)


def test_bus_factor_is_nccl_tests() -> None:
    """busbw = algbw * 2(n-1)/n for all_reduce."""
    assert bus_factor(2) == 1.0 and bus_factor(4) == 1.5 and bus_factor(8) == 1.75


def _measurements(slow_node: int | None, nnodes: int = 4) -> Measurements:
    size = 1 << 20
    pairs = []
    for a, b in itertools.combinations(range(nnodes), 2):
        rate = 2.5e6 if slow_node in (a, b) else 1e9
        pairs += [PairTiming(a, b, 8, 20e-6), PairTiming(a, b, size, size / rate)]
    return Measurements(backend="gloo", world_size=nnodes * 2, nnodes=nnodes, nproc=2,
                        hosts=tuple(f"n{k}" for k in range(nnodes)), allreduce=((8, 1e-4), (size, 0.5)),
                        pairs=tuple(pairs))


def test_throttled_node_is_the_only_one_flagged() -> None:
    """Its partners all see it slow, but each of them has a fast partner: only the slow node is flagged."""
    rows = node_figures(_measurements(slow_node=2))
    assert [r.slow for r in rows] == [False, False, True, False]
    assert rows[2].ratio is not None and rows[2].ratio < 0.01
    table = "\n".join(node_table(_measurements(slow_node=2), rows))
    assert "SLOW" in table.splitlines()[4] and "n2" in table.splitlines()[4]


def test_healthy_cluster_flags_nobody_and_two_nodes_never_blame_one_end() -> None:
    """No slow node, no flag; with two nodes the single link cannot be pinned to one node."""
    assert not any(r.slow for r in node_figures(_measurements(slow_node=None)))
    assert not any(r.slow for r in node_figures(_measurements(slow_node=1, nnodes=2)))


def test_allreduce_table_and_result_line() -> None:
    """The table reports busbw with the formula; the result line is found behind a rank prefix."""
    m = _measurements(slow_node=None)
    lines = allreduce_table(m)
    assert "2(n-1)/n = algbw * 1.75" in lines[0]
    assert lines[-1] == "  bus bandwidth: 3.67 MB/s (all_reduce of 1 MiB)"  # 1 MiB / 0.5 s * 1.75
    line = '[n1 rank 0] ' + DOCTOR_MARKER + '{"backend": "gloo", "world_size": 1, "nnodes": 1, "nproc": 1, ' \
        '"hosts": ["n1"], "allreduce": [[8, 0.001]]}'
    found = find_result(["noise", line])
    assert found is not None and found.hosts == ("n1",) and found.pairs == ()


def test_doctor_and_head_never_import_torch() -> None:
    """The doctor's launcher side and the SSH head stay torch-free (only the worker imports it)."""
    import subprocess
    import sys

    code = "import clusterddp.launch.doctor, clusterddp.launch.ssh.fanout, sys; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
