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
from typing import Mapping

#: What ``nvidia-smi`` is asked for: one CSV line per GPU, in its index (PCI bus) order.
QUERY = ("nvidia-smi", "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader")
#: One directory per GPU, named by its PCI address, when the NVIDIA driver is loaded.
DRIVER_PROC = "/proc/driver/nvidia/gpus"
#: Values of CUDA_VISIBLE_DEVICES that hide every GPU.
_HIDDEN = ("", "none", "NoDevFiles", "-1")


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


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, which cgroups and taskset shrink)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
