"""CPU affinity per worker, computed from sysfs without torch (clusterddp.affinity)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterddp.affinity import (
    CpuTopology,
    format_cpulist,
    gpu_local_cpus,
    gpu_numa_node,
    parse_cpulist,
    plan_binding,
    read_topology,
)

# A two-socket GPU node as sysfs shows it: NUMA node 0 = cpus 0-7, node 1 = cpus 8-15;
# hyperthread siblings are (0,1), (2,3)...; one L3 per 4 cpus; GPUs 0,1 on node 0, 2,3 on node 1.
GPU_ADDRESSES = ("0000:18:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0")
NODE0, NODE1 = tuple(range(8)), tuple(range(8, 16))


def fake_sysfs(root: Path, *, gpu_nodes: tuple[int, ...] = (0, 0, 1, 1)) -> Path:
    def write(path: str, text: str) -> None:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")

    write("devices/system/node/online", "0-1")
    write("devices/system/node/node0/cpulist", "0-7")
    write("devices/system/node/node1/cpulist", "8-15")
    for cpu in range(16):
        base = f"devices/system/cpu/cpu{cpu}"
        first = cpu - cpu % 2
        write(f"{base}/topology/thread_siblings_list", f"{first}-{first + 1}")
        write(f"{base}/topology/physical_package_id", str(cpu // 8))
        write(f"{base}/cache/index0/level", "1")
        write(f"{base}/cache/index0/shared_cpu_list", f"{first}-{first + 1}")
        l3 = cpu - cpu % 4
        write(f"{base}/cache/index3/level", "3")
        write(f"{base}/cache/index3/shared_cpu_list", f"{l3}-{l3 + 3}")
    for index, (address, node) in enumerate(zip(GPU_ADDRESSES, gpu_nodes)):
        write(f"bus/pci/devices/{address}/numa_node", str(node))
        if index % 2 == 0:  # half the devices also have local_cpulist, as every real one does
            write(f"bus/pci/devices/{address}/local_cpulist", "0-7" if node == 0 else "8-15")
    return root


@pytest.mark.parametrize("text, cpus", [
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
    ("5", [5]),
    ("", []),
    ("0-1,x", []),
    (" 2-3\n", [2, 3]),
])
def test_cpulist_round_trip(text: str, cpus: list[int]) -> None:
    """sysfs cpulists parse to sorted cpus and print back in the same compact form."""
    assert parse_cpulist(text) == cpus
    if cpus:
        assert parse_cpulist(format_cpulist(cpus)) == cpus


def test_format_cpulist_compacts_ranges() -> None:
    """Consecutive cpus print as ranges, as sysfs and taskset write them."""
    assert format_cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_exclusive_on_gpu_node_splits_each_numa_node(tmp_path: Path) -> None:
    """auto on 4 GPUs: each worker gets whole cores of its GPU's NUMA node, disjoint from its peer."""
    sysfs = fake_sysfs(tmp_path)
    topology = read_topology(str(sysfs), allowed=range(16))
    assert [gpu_numa_node(address, str(sysfs)) for address in GPU_ADDRESSES] == [0, 0, 1, 1]
    near = [gpu_local_cpus(address, str(sysfs)) for address in GPU_ADDRESSES]
    binding = plan_binding("auto", 4, topology, near)
    assert binding.cpus == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert binding.notes == ()


@pytest.mark.parametrize("mode, expected", [
    ("node", ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))),
    ("socket", ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))),
    ("exclusive", ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))),
    ("core-complex", ((0, 1, 2, 3), (8, 9, 10, 11))),
    ("none", (None, None)),
])
def test_modes_like_torchrun_numa_binding(tmp_path: Path, mode: str, expected: tuple[object, ...]) -> None:
    """Two GPUs on different NUMA nodes: each mode binds as torchrun's --numa-binding documents."""
    sysfs = fake_sysfs(tmp_path, gpu_nodes=(0, 1, 0, 1))
    topology = read_topology(str(sysfs), allowed=range(16))
    binding = plan_binding(mode, 2, topology, [NODE0, NODE1])
    assert binding.cpus == expected


def test_core_complex_gives_distinct_l3_groups(tmp_path: Path) -> None:
    """Two workers on one NUMA node with two L3 groups get one group each."""
    topology = read_topology(str(fake_sysfs(tmp_path)), allowed=range(16))
    assert plan_binding("core-complex", 2, topology, [NODE0, NODE0]).cpus == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_binding_stays_inside_the_launchers_mask(tmp_path: Path) -> None:
    """A launcher confined to cpus 2-5 (SLURM cgroup, taskset) never binds a worker outside them."""
    topology = read_topology(str(fake_sysfs(tmp_path)), allowed=[2, 3, 4, 5])
    binding = plan_binding("auto", 2, topology, [NODE0, NODE0])
    assert binding.cpus == ((2, 3), (4, 5))


def test_cpu_node_gets_disjoint_shares() -> None:
    """No GPUs: workers get disjoint, contiguous shares of whole cores, larger shares first."""
    topology = CpuTopology(allowed=tuple(range(10)), core={c: c for c in range(10)})
    binding = plan_binding("auto", 3, topology)
    assert binding.cpus == ((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))
    assert not set(binding.cpus[0] or ()) & set(binding.cpus[1] or ())


def test_more_workers_than_cpus_is_not_bound_with_a_note() -> None:
    """4 workers on 2 CPUs cannot have disjoint sets: none is bound, and a note says why."""
    topology = CpuTopology(allowed=(0, 1), core={0: 0, 1: 1})
    binding = plan_binding("auto", 4, topology)
    assert binding.cpus == (None,) * 4
    assert "share CPUs" in binding.notes[0]


def test_hyperthreads_split_when_cores_run_out() -> None:
    """2 workers on 1 core with 2 threads: one thread each, with a note."""
    topology = CpuTopology(allowed=(0, 1), core={0: 0, 1: 0})
    binding = plan_binding("auto", 2, topology)
    assert binding.cpus == ((0,), (1,))
    assert "hyperthreads" in binding.notes[0]


def test_unknown_gpu_bus_falls_back_to_cpu_shares() -> None:
    """GPUs whose NUMA node is unknown (MIG, no nvidia-smi bus id) still get disjoint CPU shares."""
    topology = CpuTopology(allowed=(0, 1, 2, 3), core={c: c for c in range(4)})
    binding = plan_binding("auto", 2, topology, [None, None])
    assert binding.cpus == ((0, 1), (2, 3))
    assert "unknown" in binding.notes[0]


def test_numa_node_minus_one_means_node_zero(tmp_path: Path) -> None:
    """A one-node machine reports numa_node -1 for its devices; that is node 0."""
    path = tmp_path / "bus/pci/devices/0000:01:00.0"
    path.mkdir(parents=True)
    (path / "numa_node").write_text("-1\n")
    assert gpu_numa_node("0000:01:00.0", str(tmp_path)) == 0
    assert gpu_numa_node("0000:02:00.0", str(tmp_path)) is None
    assert gpu_numa_node(None, str(tmp_path)) is None


def test_this_machines_sysfs_gives_disjoint_shares() -> None:
    """The real sysfs of this machine: 2 workers get disjoint sets within our affinity mask."""
    allowed = sorted(os.sched_getaffinity(0))
    binding = plan_binding("auto", min(2, len(allowed)), read_topology())
    bound = [set(cpus) for cpus in binding.cpus if cpus is not None]
    assert all(cpus <= set(allowed) for cpus in bound)
    if len(bound) == 2:
        assert not bound[0] & bound[1]


def test_local_cpulist_wins_over_numa_node(tmp_path: Path) -> None:
    """A device's local_cpulist is the CPUs next to it; numa_node's cpulist is the fallback."""
    sysfs = fake_sysfs(tmp_path)
    (tmp_path / "bus/pci/devices/0000:18:00.0/local_cpulist").write_text("2-5\n")
    assert gpu_local_cpus("0000:18:00.0", str(sysfs)) == (2, 3, 4, 5)
    assert gpu_local_cpus("0000:3b:00.0", str(sysfs)) == NODE0
    assert gpu_local_cpus("0000:99:00.0", str(sysfs)) is None
