"""Shared by the run registry's tests: a job file, a CLI with its own registry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO, cli_env

BIN = REPO / "tests" / "bin"


def write_job(directory: Path, name: str = "job", script: str = "exit_with.py", args: list[str] | None = None,
              **extra: Any) -> Path:
    data: dict[str, Any] = {"name": name, "script": str(BIN / script), "args": args or ["0"],
                            "nproc_per_node": 2, "backend": "gloo", "grace_period": 2, **extra}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def env_for(home: Path, **extra: str) -> dict[str, str]:
    return cli_env(CLUSTERDDP_HOME=str(home), **extra)


def clusterddp(*args: str, home: Path, cwd: Path, timeout: float = 180,
               **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env_for(home, **extra),
                          capture_output=True, text=True, timeout=timeout)


def start(*args: str, home: Path, cwd: Path, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env_for(home, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records(home: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((home / "runs").glob("*.json"))]


def wait_ready(directory: Path, count: int, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Until ``count`` ranks wrote ``rank<R>.ready`` (tests/bin/wait_for_file.py), or fail with
    the launcher's output when it ended first."""
    import time

    from tests.testbed.patience import patient

    deadline = time.monotonic() + patient(timeout)
    while len(list(directory.glob("rank*.ready"))) < count:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the launcher ended ({proc.returncode}) first:\n{out}\n{err}")
        assert time.monotonic() < deadline, "the ranks never became ready"
        time.sleep(0.05)


def waiting_job(directory: Path, name: str = "waiter") -> tuple[Path, Path, Path]:
    """A job whose 2 ranks print 'rank R started', write their ready file, wait for GO, print
    'rank R done' and exit 0: (job file, ready directory, GO file)."""
    ready = directory / f"{name}-ready"
    ready.mkdir()
    go = directory / f"{name}-go"
    return write_job(directory, name=name, script="wait_for_file.py", args=[str(ready), str(go)]), ready, go
