"""Count this node's GPUs and CPU slots without importing torch.

Order: ``CUDA_VISIBLE_DEVICES`` (what the scheduler gave us), then ``nvidia-smi -L``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Mapping


def gpu_count(env: Mapping[str, str]) -> int:
    """Visible NVIDIA GPUs; 0 when there is no driver, no GPU, or they are hidden."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e for e in visible.split(",") if e.strip() and e.strip() != "-1"]
        return 0 if visible.strip() in ("", "none", "NoDevFiles") else len(entries)
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, which cgroups and taskset shrink)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
