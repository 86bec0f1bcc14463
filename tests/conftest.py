"""Shared test helpers: run the real CLI in a subprocess, write small job files."""

from __future__ import annotations

import os
import subprocess
import tempfile
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.testbed.patience import patient

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "tests" / "bin"


#: The run registry of the suite's own runs (tests of the registry use their own).
TEST_HOME = os.path.join(tempfile.gettempdir(), f"clusterddp-tests-home-{os.getuid()}")


def cli_env(**extra: str) -> dict[str, str]:
    """The environment the launcher runs with in tests: no inherited placement variables, one
    console line per rank's line (``CLUSTERDDP_NO_MERGE=0`` merges)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PAI_", "PET_", "OMPI_", "CLUSTERDDP_"))
           and k not in ("MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "NODE_RANK", "RANK", "WORLD_SIZE",
                         "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    env["NO_COLOR"] = "1"
    # Tests count each rank's console lines; merging them has its own tests (test_console_merge).
    env["CLUSTERDDP_NO_MERGE"] = "1"
    # Runs record themselves (clusterddp/registry): the suite's go here, not into the user's registry.
    env["CLUSTERDDP_HOME"] = TEST_HOME
    env.update(extra)
    return env


def cli(*args: str, cwd: Path | str | None = None, timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m clusterddp ARGS`` to completion and capture its output."""
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd or REPO, env=env or cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def start_cli(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -m clusterddp ARGS`` in the background (the caller ends it)."""
    return subprocess.Popen([sys.executable, "-m", "clusterddp", *args], cwd=cwd or REPO, env=env or cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def write_job(directory: Path, name: str = "job", **fields: Any) -> Path:
    """A job file in ``directory``; ``script`` may name a file in tests/bin."""
    data: dict[str, Any] = {"name": name, "nproc_per_node": 2, "grace_period": 2}
    data.update(fields)
    if "script" in data and not os.path.isabs(data["script"]):
        data["script"] = str(BIN / data["script"])
    data.setdefault("logs", {"dir": str(directory / "logs")})
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it is true or ``timeout`` (at least patience.FLOOR) passes."""
    deadline = time.monotonic() + patient(timeout)
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path
