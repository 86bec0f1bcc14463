"""CPU affinity per worker, computed from sysfs without torch (clusterddp.affinity)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
from tests.conftest import REPO, cli_env, write_job

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




@pytest.mark.parametrize("cpus, cores, nproc, expected, who", [
    ((0, 1), {0: 0, 1: 1}, 2, ((0,), (1,)), "every worker is"),  # as many CPUs as workers (issue 37)
    ((0, 1, 2), {0: 0, 1: 1, 2: 2}, 2, ((0, 1), (2,)), "local rank 1 is"),  # the odd CPU out
    ((0, 1, 2, 3, 4), {c: c for c in range(5)}, 4, ((0, 1), (2,), (3,), (4,)), "local ranks 1-3 are"),
    ((0, 1), {0: 0, 1: 0}, 2, ((0,), (1,)), "every worker is"),  # one core's two hyperthreads
    ((5,), {5: 5}, 1, ((5,),), "every worker is"),
])
def test_single_cpu_shares_stay_bound_with_one_note(cpus: tuple[int, ...], cores: dict[int, int], nproc: int,
                                                    expected: tuple[tuple[int, ...], ...], who: str) -> None:
    """A worker left one CPU stays bound (bound ran faster: benchmarks/loader_affinity.py), and
    one note says torch's DataLoader warns there, quoting it, with the figure and the way out."""
    binding = plan_binding("auto", nproc, CpuTopology(allowed=cpus, core=cores))
    assert binding.cpus == expected
    notes = [note for note in binding.notes if "DataLoader" in note]
    assert len(notes) == 1 and notes[0].startswith(who + " bound to a single CPU"), binding.notes
    assert "Our suggested max number of worker in current system is 1" in notes[0]
    assert "benchmarks/loader_affinity.py" in notes[0] and "cpu_affinity: none" in notes[0]


def test_single_cpu_note_on_gpu_node(tmp_path: Path) -> None:
    """Two GPUs whose NUMA node the launcher may use only 2 CPUs of: exclusive gives one each, with the note."""
    topology = read_topology(str(fake_sysfs(tmp_path)), allowed=[0, 2])
    binding = plan_binding("exclusive", 2, topology, [NODE0, NODE0])
    assert binding.cpus == ((0,), (2,))
    assert [note for note in binding.notes if "DataLoader" in note] != []


@pytest.mark.parametrize("mode, nproc, cpus", [
    ("auto", 2, (0, 1, 2, 3)),  # two CPUs each: torch suggests 2 loader processes, no warning
    ("none", 2, (0, 1)),
    ("auto", 4, (0, 1)),  # more workers than CPUs: not bound at all
])
def test_no_single_cpu_note_when_no_worker_has_one_cpu(mode: str, nproc: int, cpus: tuple[int, ...]) -> None:
    """The note is there only when a worker is bound to exactly one CPU."""
    binding = plan_binding(mode, nproc, CpuTopology(allowed=cpus, core={c: c for c in cpus}))
    assert not [note for note in binding.notes if "DataLoader" in note], binding.notes


def _launch_on_two_cpus(job: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``clusterddp run JOB FLAGS`` from a launcher that has exactly 2 CPUs (taskset), the
    same on any machine; the output with every rank's log."""
    two = format_cpulist(sorted(os.sched_getaffinity(0))[:2])
    return subprocess.run(["taskset", "-c", two, sys.executable, "-m", "clusterddp", "run", str(job), *flags],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=180)


def test_one_cpu_workers_and_torchs_dataloader_warning_explained(tmp_path: Path) -> None:
    """Issue 37: a launcher with 2 CPUs binds its 2 gloo ranks to one CPU each under auto
    (kept: bound ran faster than unbound, benchmarks/loader_affinity.py), so each rank's
    DataLoader(num_workers=2) makes torch warn; the dry run's one affinity note says so,
    quoting torch, with the figure and how to unbind."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs 2 CPUs in this process's affinity mask")
    job = write_job(tmp_path, script="loader_workers.py", cpu_affinity="auto")
    result = _launch_on_two_cpus(job)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").rglob("rank*.log")))
    output = result.stdout + result.stderr + logs
    assert result.returncode == 0, output
    assert output.count("sum 240") >= 2, output  # both ranks read every batch: 2 x (0 + ... + 15)
    assert sorted(re.findall(r"cpus (\[[\d, ]*\])", result.stdout)) == [f"[{allowed[0]}]", f"[{allowed[1]}]"], output
    torch_says = "Our suggested max number of worker in current system is 1"
    assert torch_says in output, output  # torch's own words, which the note must quote
    dry = _launch_on_two_cpus(job, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    notes = [line for line in dry.stdout.splitlines() if line.startswith("note:") and "DataLoader" in line]
    assert len(notes) == 1, dry.stdout
    assert torch_says in notes[0] and "benchmarks/loader_affinity.py" in notes[0], notes[0]
    assert "cpu_affinity: none" in notes[0], notes[0]
