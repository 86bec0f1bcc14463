"""Placement on GPU nodes: one worker per visible GPU, nccl never oversubscribed, device isolation.

There is no GPU in CI: these tests drive the launcher through the variables and the
nvidia-smi output a GPU node gives it, and check the plan it prints (``--dry-run``).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from clusterddp.devices import gpu_inventory, pci_address
from tests.conftest import REPO, cli, cli_env, write_job

HELLO = str(REPO / "jobs" / "hello.yaml")
#: What `nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader` prints on a 2-GPU node.
SMI_OUTPUT = "0, 00000000:18:00.0, GPU-aaaa1111\n1, 00000000:AF:00.0, GPU-bbbb2222\n"


def _plan(*flags: str, **env: str) -> tuple[int, str, str]:
    result = cli("run", HELLO, "--dry-run", *flags, env=cli_env(**env))
    return result.returncode, result.stdout, result.stderr


def _workers(stdout: str) -> int:
    match = re.search(r"x (\d+) worker\(s\)", stdout)
    assert match, stdout
    return int(match.group(1))


@pytest.mark.parametrize("visible, workers", [("0", 1), ("0,1,2,3", 4), ("2,5", 2)])
def test_one_worker_per_visible_gpu(visible: str, workers: int) -> None:
    """The shipped hello job plans exactly one nccl worker per GPU in CUDA_VISIBLE_DEVICES."""
    rc, out, err = _plan(CUDA_VISIBLE_DEVICES=visible)
    assert rc == 0, err
    assert _workers(out) == workers
    assert "backend nccl" in out


def test_cpu_only_node_runs_two_gloo_workers() -> None:
    """Without a visible GPU the default job plans 2 gloo workers, whatever the core count."""
    rc, out, err = _plan(CUDA_VISIBLE_DEVICES="")
    assert rc == 0, err
    assert _workers(out) == 2 and "backend gloo" in out


def test_more_nccl_workers_than_gpus_is_one_line() -> None:
    """--nproc-per-node 2 on one visible GPU: one line naming the count and its source, exit 2."""
    rc, out, err = _plan("--nproc-per-node", "2", CUDA_VISIBLE_DEVICES="0")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--nproc-per-node: 2 nccl worker(s) but this node has 1 visible GPU(s) (CUDA_VISIBLE_DEVICES=0)" in err


def test_gloo_may_share_gpus(tmp_path: Path) -> None:
    """backend: gloo with more workers than GPUs is a CPU job and is not refused."""
    job = write_job(tmp_path, script="exit_with.py", backend="gloo", nproc_per_node=3)
    result = cli("run", str(job), "--dry-run", env=cli_env(CUDA_VISIBLE_DEVICES="0"))
    assert result.returncode == 0, result.stderr
    assert _workers(result.stdout) == 3 and "backend gloo" in result.stdout


def test_virtual_local_rank_isolates_each_gpu() -> None:
    """--virtual-local-rank: worker i sees only the i-th visible GPU (as written) and LOCAL_RANK=0."""
    rc, out, err = _plan("--virtual-local-rank", CUDA_VISIBLE_DEVICES="3,GPU-abc")
    assert rc == 0, err
    blocks = out.split("\nrank ")[1:]
    assert len(blocks) == 2
    assert "CUDA_VISIBLE_DEVICES=3\n" in blocks[0] and "LOCAL_RANK=0" in blocks[0]
    assert "CUDA_VISIBLE_DEVICES=GPU-abc\n" in blocks[1] and "LOCAL_RANK=0" in blocks[1]
    assert "RANK=1" in blocks[1]


def test_virtual_local_rank_without_gpus_is_one_line() -> None:
    """--virtual-local-rank on a CPU-only node: one line naming the flag, exit 2."""
    rc, out, err = _plan("--virtual-local-rank", CUDA_VISIBLE_DEVICES="")
    assert rc == 2 and err.startswith("clusterddp: error: --virtual-local-rank: local rank 0 has no GPU")


@pytest.mark.parametrize("visible, count", [("", 0), ("-1", 0), ("NoDevFiles", 0), ("0,1,-1,2", 2), (" 1 , 2 ", 2)])
def test_cuda_visible_devices_as_cuda_reads_it(visible: str, count: int) -> None:
    """CUDA stops at the first invalid entry (-1) and hides every GPU for an empty value."""
    assert gpu_inventory({"CUDA_VISIBLE_DEVICES": visible}, query=False).count == count


def test_bus_ids_from_nvidia_smi(tmp_path: Path) -> None:
    """With nvidia-smi's CSV (a stand-in script: no GPU here), GPUs get sysfs PCI addresses, also by UUID."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{SMI_OUTPUT}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    path = f"{tmp_path}:{os.environ.get('PATH', '')}"
    old = os.environ.get("PATH")
    os.environ["PATH"] = path
    try:
        everything = gpu_inventory({})
        by_uuid = gpu_inventory({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"})
    finally:
        os.environ["PATH"] = old or ""
    assert everything.source == "nvidia-smi"
    assert [g.pci_address for g in everything.gpus] == ["0000:18:00.0", "0000:af:00.0"]
    assert [g.pci_address for g in by_uuid.gpus] == ["0000:af:00.0"]


@pytest.mark.parametrize("bus_id, address", [
    ("00000000:18:00.0", "0000:18:00.0"),
    ("00000001:AF:00.0", "0001:af:00.0"),
    ("garbage", None),
    ("zz:18:00.0", None),
])
def test_pci_address_spelling(bus_id: str, address: str | None) -> None:
    """nvidia-smi's 8-digit domain becomes sysfs's 4-digit, lower-case address."""
    assert pci_address(bus_id) == address


def test_driver_proc_files_give_bus_order_and_uuids(tmp_path: Path) -> None:
    """The driver's /proc/driver/nvidia/gpus/<bus>/information (a copy here) gives indexes in bus order."""
    from clusterddp.devices import _driver_rows

    for bus, uuid in (("0000:af:00.0", "GPU-bbbb"), ("0000:18:00.0", "GPU-aaaa")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: \t NVIDIA H100\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n")
    rows = _driver_rows(str(tmp_path))
    assert rows == {"0": ("0", "0000:18:00.0", "GPU-aaaa"), "1": ("1", "0000:af:00.0", "GPU-bbbb")}
    assert pci_address(rows["1"][1]) == "0000:af:00.0"
    assert _driver_rows(str(tmp_path / "absent")) == {}


def test_workers_run_on_their_planned_cpus(tmp_path: Path) -> None:
    """Real workers: each one's sched_getaffinity is its planned, disjoint share; 'none' leaves them unbound."""
    script = tmp_path / "affinity.py"
    script.write_text("import os\nprint('cpus', os.environ['RANK'], sorted(os.sched_getaffinity(0)))\n")
    allowed = sorted(os.sched_getaffinity(0))
    bound = cli("run", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"), "--", str(script))
    free = cli("run", "--nproc-per-node", "2", "--cpu-affinity", "none", "--log-dir", str(tmp_path / "logs"),
               "--", str(script))
    assert bound.returncode == 0 and free.returncode == 0, bound.stderr + free.stderr

    def seen(out: str) -> dict[str, list[int]]:
        found = re.findall(r"cpus (\d) (\[[\d, ]*\])", out)
        return {rank: json.loads(cpus) for rank, cpus in found}

    sets = seen(bound.stdout)
    assert set(sets) == {"0", "1"}
    if len(allowed) >= 2:
        assert not set(sets["0"]) & set(sets["1"]) and set(sets["0"]) | set(sets["1"]) <= set(allowed)
    assert seen(free.stdout) == {"0": allowed, "1": allowed}
