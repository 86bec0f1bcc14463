"""Count and locate this node's GPUs and CPU slots without importing torch.

Order: ``CUDA_VISIBLE_DEVICES`` (what the scheduler gave us), then the driver's
``/proc/driver/nvidia/gpus`` (or ``nvidia-smi`` where that is hidden). The GPUs' PCI bus ids
come from there too: they say which NUMA node each GPU hangs off
(clusterddp.affinity), so a worker can run on the cores next to its GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping

#: What ``nvidia-smi`` is asked for: one CSV line per GPU, in its index (PCI bus) order.
QUERY = ("nvidia-smi", "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader")
#: One directory per GPU, named by its PCI address, when the NVIDIA driver is loaded.
DRIVER_PROC = "/proc/driver/nvidia/gpus"
#: Values of CUDA_VISIBLE_DEVICES that hide every GPU.
_HIDDEN = ("", "none", "NoDevFiles", "-1")
#: Where cgroup file systems are mounted, and which cgroup this process is in.
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


@dataclass(frozen=True)
class Gpu:
    """One GPU as this node's workers see it: ``cuda:<visible_index>``."""

    visible_index: int
    #: The CUDA_VISIBLE_DEVICES entry (an index, a UUID or a MIG id) or the nvidia-smi index.
    entry: str
    #: sysfs PCI address (``0000:18:00.0``); None when nvidia-smi does not know the entry.
    pci_address: str | None = None


@dataclass(frozen=True)
class GpuInventory:
    """The visible GPUs and where that answer came from (named in placement errors)."""

    gpus: tuple[Gpu, ...]
    source: str

    @property
    def count(self) -> int:
        return len(self.gpus)


def gpu_inventory(env: Mapping[str, str], query: bool = True) -> GpuInventory:
    """The GPUs the workers will see, in CUDA's numbering, with their PCI addresses.

    ``query=False`` skips nvidia-smi when only CUDA_VISIBLE_DEVICES matters (no bus ids).
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    rows = _nvidia_smi_rows() if query or visible is None else {}
    if visible is not None:
        source = f"CUDA_VISIBLE_DEVICES={visible}"
        if visible.strip() in _HIDDEN:
            return GpuInventory((), source)
        entries = []
        for raw in visible.split(","):
            entry = raw.strip()
            if entry == "-1":  # CUDA stops at the first invalid entry
                break
            if entry:
                entries.append(entry)
        gpus = tuple(Gpu(i, e, _address_of(e, rows)) for i, e in enumerate(entries))
        return GpuInventory(gpus, source)
    if not rows:
        return GpuInventory((), "nvidia-smi (no GPU found)" if shutil.which("nvidia-smi") else "no nvidia-smi")
    ordered = sorted(rows.values(), key=lambda row: int(row[0]))
    gpus = tuple(Gpu(i, row[0], pci_address(row[1])) for i, row in enumerate(ordered))
    return GpuInventory(gpus, "nvidia-smi")


def gpu_count(env: Mapping[str, str]) -> int:
    """Visible NVIDIA GPUs; 0 when there is no driver, no GPU, or they are hidden."""
    return gpu_inventory(env, query=False).count


def pci_address(bus_id: str) -> str | None:
    """nvidia-smi's ``00000000:18:00.0`` as sysfs spells it: ``0000:18:00.0``."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    try:
        domain = int(parts[0], 16)
    except ValueError:
        return None
    return f"{domain:04x}:{parts[1]}:{parts[2]}"


def _address_of(entry: str, rows: Mapping[str, tuple[str, str, str]]) -> str | None:
    """A CUDA_VISIBLE_DEVICES entry (index or ``GPU-<uuid>`` prefix) to its PCI address."""
    if entry in rows:
        return pci_address(rows[entry][1])
    for index, bus_id, uuid in rows.values():
        if entry.startswith("GPU-") and uuid.startswith(entry):
            return pci_address(bus_id)
    return None  # MIG instances and unknown entries: no placement hint


def _driver_rows(root: str = DRIVER_PROC) -> dict[str, tuple[str, str, str]]:
    """index -> (index, bus id, uuid) from the driver's /proc files, in PCI bus order (the
    order of nvidia-smi's indexes): a directory listing instead of a 0.1-1 s nvidia-smi run."""
    try:
        buses = sorted(os.listdir(root))
    except OSError:
        return {}
    rows: dict[str, tuple[str, str, str]] = {}
    for index, bus in enumerate(buses):
        uuid = ""
        try:
            with open(os.path.join(root, bus, "information"), encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("GPU UUID:"):
                        uuid = line.split(":", 1)[1].strip()
        except OSError:
            return {}
        rows[str(index)] = (str(index), bus, uuid)
    return rows


def _nvidia_smi_rows() -> dict[str, tuple[str, str, str]]:
    """index -> (index, bus id, uuid) from the driver, else nvidia-smi; empty without a driver."""
    from_driver = _driver_rows()
    if from_driver:
        return from_driver
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(list(QUERY), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0:
        return {}
    rows: dict[str, tuple[str, str, str]] = {}
    for line in out.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[0].isdigit():
            rows[fields[0]] = (fields[0], fields[1], fields[2])
    return rows


def cpu_count(cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> int:
    """CPUs this process may use: the affinity mask (which cpusets and taskset shrink), and
    no more than the cgroup's CPU quota rounded up (a pod's ``limits.cpu``, ``docker --cpus``),
    as Kubernetes rounds a CPU quantity up (``2500m`` is 3) when Kubeflow's torch plugin
    turns it into ``PET_NPROC_PER_NODE``."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        allowed = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cgroup_root, proc_cgroup)
    return max(1, min(allowed, quota)) if quota is not None else allowed


def cgroup_cpu_limit(cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> int | None:
    """The tightest CPU quota over this process's cgroup and its ancestors, in whole CPUs
    (rounded up); None without a quota. Reads cgroup v2 ``cpu.max`` ("max 100000" or
    "250000 100000") and v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none)."""
    try:
        with open(proc_cgroup, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            limits += _quotas(cgroup_root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # mounted as "cpu,cpuacct", with a "cpu" link
            for mount in {os.path.join(cgroup_root, controllers), os.path.join(cgroup_root, "cpu")}:
                limits += _quotas(mount, path, _v1_quota)
    return min(limits) if limits else None


def _quotas(mount: str, path: str, read: Callable[[str], int | None]) -> list[int]:
    """The quota of ``path`` under ``mount`` and of each ancestor up to the mount itself (a
    container sees the host's path but mounts only its own cgroup: missing levels are skipped)."""
    found = []
    parts = [part for part in path.split("/") if part and part not in (".", "..")]
    for depth in range(len(parts), -1, -1):
        quota = read(os.path.join(mount, *parts[:depth]))
        if quota is not None:
            found.append(quota)
    return found


def _read_words(path: str) -> list[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().split()
    except OSError:
        return []


def _whole_cpus(quota: str, period: str) -> int | None:
    """``quota / period`` rounded up; None for 'max', -1 or anything unreadable."""
    if not quota.isdigit() or not period.isdigit() or int(period) == 0 or int(quota) == 0:
        return None
    return -(-int(quota) // int(period))


def _v2_quota(directory: str) -> int | None:
    words = _read_words(os.path.join(directory, "cpu.max"))
    return _whole_cpus(words[0], words[1]) if len(words) == 2 else None


def _v1_quota(directory: str) -> int | None:
    quota = _read_words(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read_words(os.path.join(directory, "cpu.cfs_period_us"))
    return _whole_cpus(quota[0], period[0]) if len(quota) == 1 and len(period) == 1 else None
