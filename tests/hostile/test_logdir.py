"""The run's log directory under faults and misuse: a disk that turns read-only between
attempts, and two launchers that would write the same ranks' logs (issue 17, items 2 and 5)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.conftest import cli, start_cli, wait_for, write_job


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """A read-only tmpfs holding a stale ``rank0.error.json`` (an earlier attempt's), and a
    function that mounts it over a directory mid-run; everything unmounted whatever happens.

    A real read-only filesystem, not a chmod (root writes through any mode), and mounted over
    the run's directory because ``remount,ro`` is refused (EBUSY) while the launcher holds the
    log files open for writing; the effect on what the launcher opens next is the same."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    mounted = [disk]
    try:
        (disk / "rank0.error.json").write_text(json.dumps({"message": "a stale error of another attempt"}))
        done = _mount("-o", "remount,ro", str(disk))
        assert done.returncode == 0, done.stderr

        def over(target: Path) -> None:
            bound = _mount("--bind", str(disk), str(target))
            assert bound.returncode == 0, bound.stderr
            mounted.append(target)

        yield over
    finally:
        for path in reversed(mounted):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _run_turning_read_only(tmp_path: Path, read_only_disk: Callable[[Path], None],
                           *args: str) -> tuple[subprocess.Popen[str], str, str]:
    """Run fail_until_readonly.py with ``restarts: 1``; make the run's log directory read-only
    while attempt 0 runs (its rank then exits 7)."""
    run_dir = tmp_path / "logs" / "ro"
    job = write_job(tmp_path, script="fail_until_readonly.py", args=[str(run_dir), *args], nproc_per_node=1,
                    restarts=1, grace_period=1)
    proc = start_cli("run", str(job), "--run-id", "ro")
    try:
        assert wait_for(lambda: b"attempt 0" in (run_dir / "rank0.log").read_bytes()
                        if (run_dir / "rank0.log").exists() else False, timeout=60)
        read_only_disk(run_dir)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, out, err


def test_a_log_dir_turned_read_only_does_not_stop_the_restart(tmp_path: Path,
                                                              read_only_disk: Callable[[Path], None]) -> None:
    """Log dir read-only after attempt 0 started: the restart runs console-only and the job exits 0."""
    proc, out, err = _run_turning_read_only(tmp_path, read_only_disk)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    assert "rank 0 attempt 1" in out
    warnings = [line for line in err.splitlines() if "cannot write its log" in line]
    assert len(warnings) == 1 and "Read-only file system" in warnings[0], err


def test_a_stale_error_file_on_a_read_only_disk_is_not_the_root_cause(
        tmp_path: Path, read_only_disk: Callable[[Path], None]) -> None:
    """The restart fails too: the report shows its own stderr, not the error file it could not remove."""
    proc, out, err = _run_turning_read_only(tmp_path, read_only_disk, "always")
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 7, err[-3000:]
    last_lines = err.split("last lines:", 1)[1]
    assert "attempt 1 failed on its own" in last_lines
    assert "stale error" not in err
