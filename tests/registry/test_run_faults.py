"""Faults of a recorded run (issue 33, "Bad input and faults"): ``ls`` says ``restarting``
between two attempts of a real launcher, and a detached launcher whose console disk fills up
keeps running its job to its own end, recorded, with ``attach`` exiting with the run's code."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.registry.helpers import BIN, clusterddp, records, start, write_job
from tests.testbed.patience import patient


def _rows(home: Path, cwd: Path) -> list[dict[str, Any]]:
    done = clusterddp("ls", "--json", home=home, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["runs"])


def test_ls_says_restarting_between_two_attempts(tmp_path: Path) -> None:
    """A job whose rank 1 always fails, restarts 6: between attempts (backoffs 0, 1, 2, 4, 8,
    16 s) ``ls`` shows ``restarting`` with the attempts so far; ``stop`` then ends it, and ls
    says stopped. Whichever gap ``ls`` lands in first, it lands in one: no timing is asserted."""
    home = tmp_path / "home"
    job = write_job(tmp_path, name="again", args=["3"], restarts=6)
    launcher = start("run", str(job), home=home, cwd=tmp_path)
    try:
        deadline = time.monotonic() + patient(120)
        seen: list[tuple[str, int]] = []
        while not any(state == "restarting" for state, _ in seen):
            assert launcher.poll() is None and time.monotonic() < deadline, (seen, launcher.communicate())
            rows = _rows(home, tmp_path)
            seen += [(row["state"], row["attempts"]) for row in rows]
        state, attempts = next(s for s in seen if s[0] == "restarting")
        assert attempts >= 1, seen
        [row] = _rows(home, tmp_path)
        stop = clusterddp("stop", row["run_id"], home=home, cwd=tmp_path)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        launcher.wait(timeout=patient(60))
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    [after] = _rows(home, tmp_path)
    assert after["state"] == "stopped" and after["attempts"] >= 2, after
    print(f"ls saw {seen[-1]} while restarting, then {after['state']} after {after['attempts']} attempts")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (the detached launcher's run dir, console included), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_detached_launcher_on_a_full_disk_runs_its_job_to_its_end(tmp_path: Path, tiny_disk: Path) -> None:
    """A detached run whose logs (console.log and rank logs) are on a 1 MiB tmpfs, each rank
    printing 2 MiB (tests/bin/flood.py) and rank 1 then failing with exit 3: the disk fills
    while the detached launcher writes its console, yet the launcher runs the job to its own
    end: the registry (on another disk) records failed, exit 3, rank 1 as the root cause;
    ``attach`` prints what the console holds and exits 3; nothing of the run is left."""
    home = tmp_path / "home"
    job = write_job(tmp_path, name="fill", script=str(BIN / "flood.py"), args=["2", "1"],
                    logs={"dir": str(tiny_disk)})
    detached = clusterddp("run", str(job), "--detach", home=home, cwd=tmp_path)
    assert detached.returncode in (0, 3), detached.stdout + detached.stderr  # 3: it ended before every rank ran
    [record] = records(home)
    deadline = time.monotonic() + patient(120)
    while json.loads((home / "runs" / f"{record['run_id']}.json").read_text())["state"] == "running":
        assert time.monotonic() < deadline, "the detached launcher never recorded its end"
        time.sleep(0.1)
    [row] = _rows(home, tmp_path)
    assert (row["state"], row["exit_code"]) == ("failed", 3), row
    assert "rank 1" in (row["root_cause"] or ""), row
    attach = clusterddp("attach", row["run_id"], home=home, cwd=tmp_path)
    assert attach.returncode == 3, attach.stderr[-2000:]
    assert "Traceback" not in attach.stdout + attach.stderr
    statvfs = os.statvfs(tiny_disk)
    assert statvfs.f_bavail * statvfs.f_frsize < 64 * 1024, "the disk never filled up"
    left = subprocess.run(["pgrep", "-f", record["run_id"]], capture_output=True, text=True).stdout.split()
    assert not left, left
