"""Fixtures for SSH fan-out tests: a real sshd lab and a real head process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.conftest import TEST_HOME
from tests.testbed import SSHLab, lab_unavailable_reason, ssh_lab
from tests.testbed.patience import patient

REPO = Path(__file__).resolve().parents[2]
BIN = Path(__file__).resolve().parent / "bin"


def _lab(n: int) -> Iterator[SSHLab]:
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with ssh_lab(n) as lab:
        yield lab


@pytest.fixture
def lab2() -> Iterator[SSHLab]:
    """Two sshd hosts, each in its own network namespace; torn down after the test."""
    yield from _lab(2)


@pytest.fixture
def lab3() -> Iterator[SSHLab]:
    """Three sshd hosts, each in its own network namespace; torn down after the test."""
    yield from _lab(3)


@pytest.fixture
def lab4() -> Iterator[SSHLab]:
    """Four sshd hosts, each in its own network namespace; torn down after the test."""
    yield from _lab(4)


def write_job(lab: SSHLab, script: str, *, nproc: int = 2, args: list[str] | None = None,
              env: dict[str, str] | None = None, ssh: dict[str, Any] | None = None,
              name: str = "t") -> Path:
    """A job file in the lab directory that reaches the lab through its ssh_config."""
    data: dict[str, Any] = {
        "name": name, "script": str(BIN / script) if not os.path.isabs(script) else script,
        "nproc_per_node": nproc, "grace_period": 2,
        "ssh": {"config_file": str(lab.ssh_config), "connect_timeout": 3, **(ssh or {})},
    }
    if args is not None:
        data["args"] = args
    if env:
        data["env"] = env
    path = lab.root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def launcher_pid(lab: SSHLab, host_name: str) -> int:
    """The launcher on a host: the stub the head started became it (``python -c SOURCE``). Its
    forked reaper (and a worker between fork and exec) has the same command line, so the
    launcher is the one whose parent is not such a process."""
    stubs: dict[int, int] = {}
    for pid in lab.processes(lab.host(host_name)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"CLUSTERDDP_PROBE" in cmdline:
            stubs[pid] = parent
    launchers = [pid for pid, parent in stubs.items() if parent not in stubs]
    assert len(launchers) == 1, f"launchers on {host_name}: {stubs} (pid: parent)"
    return launchers[0]


class Head:
    """``python -m clusterddp run ...`` as a child process, its output collected by threads."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, **(env or {})}
        full_env.pop("CLUSTERDDP_HOSTFILE", None)
        full_env.setdefault("CLUSTERDDP_HOME", TEST_HOME)  # the head records its run (clusterddp/registry)
        self.proc = subprocess.Popen([sys.executable, "-m", "clusterddp", "run", *argv], cwd=cwd, env=full_env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._changed = threading.Condition()
        self._threads = [threading.Thread(target=self._read, args=(s, out), daemon=True)
                         for s, out in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))]
        for thread in self._threads:
            thread.start()

    def _read(self, stream: Any, lines: list[str]) -> None:
        for raw in stream:
            with self._changed:
                lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 60.0) -> list[str]:
        """Block until ``count`` stdout lines match ``pattern``; fail with the output if not."""
        regex = re.compile(pattern)
        timeout = patient(timeout)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [line for line in self.stdout if regex.search(line)]
                if len(found) >= count:
                    return found
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"waited for {count} x {pattern!r}:\n{self.output()}")
                self._changed.wait(0.1)

    def finish(self, timeout: float = 120.0) -> int:
        timeout = patient(timeout)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"head did not finish in {timeout}s:\n{self.output()}") from None
        for thread in self._threads:
            thread.join(5)
        return code

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def output(self) -> str:
        return "--- stdout\n" + "\n".join(self.stdout) + "\n--- stderr\n" + "\n".join(self.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def head_factory(tmp_path: Path) -> Iterator[Any]:
    """Start heads in a scratch directory (their logs go there); kill any left running."""
    heads: list[Head] = []

    def start(*argv: str, env: dict[str, str] | None = None) -> Head:
        head = Head(list(argv), cwd=tmp_path, env=env)
        heads.append(head)
        return head

    yield start
    for head in heads:
        head.kill()
