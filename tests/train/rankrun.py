"""Start N real gloo workers with the torchrun env contract (clusterddp.train tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).resolve().parent / "bin" / "scenarios.py"

#: Variables of any outer launcher or scheduler that must not leak into the workers.
PLACEMENT_PREFIXES = ("SLURM_", "PAI_", "PET_", "OMPI_", "CLUSTERDDP_", "TORCHELASTIC_")
PLACEMENT_NAMES = {"MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "NODE_RANK", "RANK", "WORLD_SIZE",
                   "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_RANK",
                   "ROLE_WORLD_SIZE"}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment minus placement variables, one thread per process, repo importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(PLACEMENT_PREFIXES) and k not in PLACEMENT_NAMES}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def run_ranks(args: list[str], nproc: int = 2, timeout: float = 600.0,
              env: dict[str, str] | None = None, script: Path = SCENARIOS,
              prefix: Sequence[str] = ()) -> list[RankResult]:
    """Run ``python scenarios.py ARGS`` as ``nproc`` ranks on loopback; wait for all.

    On timeout every rank still running is killed (by its own PID) and the test fails with
    what the ranks printed, rather than the suite hanging.
    """
    port = free_port()
    procs = []
    for rank in range(nproc):
        contract = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([*prefix, sys.executable, str(script), *args], cwd=REPO,
                                      env=clean_env(**contract, **(env or {})),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                if other.poll() is None:
                    other.send_signal(signal.SIGKILL)
            outputs = [p.communicate() for p in procs]
            pytest.fail(f"ranks still running after {timeout}s; output: {outputs}")
        results.append(RankResult(rank, proc.returncode, out, err))
    return results


def assert_ok(results: list[RankResult]) -> None:
    """Every rank exited 0; otherwise show what each printed."""
    bad = [r for r in results if r.returncode != 0]
    assert not bad, "\n".join(f"rank {r.rank} exit {r.returncode}\n{r.stderr[-3000:]}" for r in bad)
