"""Fixtures for diagnosis across hosts: SSH labs of 2 and 4 hosts, heads, job files."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ssh.conftest import REPO, Head, head_factory, lab2, lab4  # noqa: F401 (fixtures re-exported here)
from tests.testbed import SSHLab

BIN = REPO / "tests" / "bin"


def write_job(lab: SSHLab, script: str | Path, name: str = "t", **fields: Any) -> Path:
    """A job file in the lab directory that reaches the lab through its ssh_config."""
    data: dict[str, Any] = {
        "name": name, "script": str(script if Path(script).is_absolute() else BIN / script),
        "nproc_per_node": 2, "grace_period": 1, "env": {"OMP_NUM_THREADS": "1"},
        "ssh": {"config_file": str(lab.ssh_config), "connect_timeout": 3},
    }
    data.update(fields)
    path = lab.root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def wait_stderr(head: Head, pattern: str, timeout: float) -> tuple[str, float]:
    """The first stderr line of ``head`` matching ``pattern`` and when it was seen (monotonic)."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(head.stderr):
            if regex.search(line):
                return line, time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"no stderr line matching {pattern!r} within {timeout}s:\n{head.output()}")


def assert_clean(lab: SSHLab, within: float) -> float:
    """Nothing but sshd left in any host's network namespace; returns how long that took."""
    clean, seconds, left = lab.wait_clean(within)
    assert clean, f"processes left after {within}s: {left}"
    return seconds
