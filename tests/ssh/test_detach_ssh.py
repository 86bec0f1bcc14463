"""``clusterddp run --hostfile H --detach`` on the real SSH test bed (issue 33, goal 1 for SSH):
the head goes to the first host of the hostfile (``launch.remotehead``), this machine keeps a
record of where; ``ls``, ``status``, ``attach``, ``logs`` and ``stop`` ask that host.

The test bed's "typing machine" is the root namespace (10.78.0.1 on the bridge every host hangs
off); hosts talk to each other over the bridge without it. Taking that address off the bridge
cuts the typing side off from every host while the hosts still reach each other: the cut the
issue's acceptance asks for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ssh.conftest import REPO, write_job
from tests.testbed import SSHLab, namespaces  # noqa: F401  (the acceptance test cuts the bridge)
from tests.testbed.netns import BRIDGE, BRIDGE_IP
from tests.testbed.patience import patient

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def cddp(home: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``clusterddp ARGS`` on the typing side, with the test's registry."""
    env = {**os.environ, "CLUSTERDDP_HOME": str(home)}
    env.pop("CLUSTERDDP_HOSTFILE", None)
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=patient(timeout), stdin=subprocess.DEVNULL)


def started(home: Path, cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CLUSTERDDP_HOME": str(home)}
    return subprocess.Popen([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def runs(home: Path, cwd: Path, *flags: str) -> list[dict[str, Any]]:
    listed = cddp(home, cwd, "ls", "--json", *flags)
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["runs"])


def detach(home: Path, cwd: Path, job: Path, lab: SSHLab, *extra: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    done = cddp(home, cwd, "run", str(job), "--hostfile", str(lab.hostfile), "--detach", *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1], done


def head_record(home: Path, run_id: str) -> dict[str, Any]:
    return dict(json.loads((home / "runs" / f"{run_id}.json").read_text()))


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + patient(timeout)
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout}s for {what}"
        time.sleep(0.1)


def test_a_detached_head_lives_on_the_first_host_and_stop_ends_every_rank(lab2: SSHLab, tmp_path: Path) -> None:
    """run --detach returns with every rank running and the head on cdssh1 (not here); ls and
    status say running over SSH; stop RUN ends every rank on every host; ls says stopped."""
    home = tmp_path / "home"
    job = write_job(lab2, "wait_forever.py", name="waits")
    run_id, done = detach(home, tmp_path, job, lab2)
    assert "its head runs on cdssh1" in done.stderr, done.stderr
    record = head_record(home, run_id)
    head_pid = record["head"]["pid"]["pid"]
    assert head_pid in lab2.processes(lab2.host("cdssh1")), "the head does not run on cdssh1"
    console = Path(record["console"])
    ready = [line for line in console.read_text().splitlines() if "ready rank" in line]
    [row] = runs(home, tmp_path)
    assert (row["state"], row["target"], row["detached"]) == ("running", "ssh", True), row
    status = cddp(home, tmp_path, "status", run_id)
    assert "state:       running" in status.stdout, status.stdout + status.stderr
    stop = cddp(home, tmp_path, "stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    clean, _, left = lab2.wait_clean(15)
    assert clean, left
    [after] = runs(home, tmp_path)
    assert (after["state"], after["exit_code"]) == ("stopped", 143), after
    print(f"ranks ready when run --detach returned: {len(ready)} of 4")


def test_a_detached_head_sigkilled_is_lost_and_its_ranks_end(lab2: SSHLab, tmp_path: Path) -> None:
    """The detached head SIGKILLed on cdssh1: ls says lost (judged on that host), every rank on
    every host ends within the launchers' keepalive timeout, nothing is left anywhere."""
    home = tmp_path / "home"
    job = write_job(lab2, "wait_forever.py", name="waits")
    run_id, _ = detach(home, tmp_path, job, lab2)
    head_pid = head_record(home, run_id)["head"]["pid"]["pid"]
    os.kill(head_pid, signal.SIGKILL)
    killed = time.monotonic()
    clean, seconds, left = lab2.wait_clean(20)
    assert clean, left
    [row] = runs(home, tmp_path)
    assert row["state"] == "lost", row
    assert "launcher is gone" in (row["note"] or ""), row
    print(f"head SIGKILLed -> every host clean in {time.monotonic() - killed:.1f}s (wait_clean {seconds:.1f}s)")


def test_a_refused_detached_run_prints_the_heads_line_and_its_code(lab2: SSHLab, tmp_path: Path) -> None:
    """The master port busy on cdssh1: the head's preflight there refuses the run; run --detach
    prints the head's own lines and exits with its code (2); ls records it failed; nothing of
    the run is left. (A refusal this machine can see, a missing script, stays one line here.)"""
    home = tmp_path / "home"
    job = write_job(lab2, "wait_forever.py", name="busy")
    port = "29531"
    holder = subprocess.Popen(["nsenter", f"--net={lab2.host('cdssh1').netns_path}", sys.executable, "-c",
                               f"import socket, time; s = socket.socket(); s.bind(('0.0.0.0', {port})); "
                               "s.listen(); print('bound', flush=True); time.sleep(300)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "bound"
        done = cddp(home, tmp_path, "run", str(job), "--hostfile", str(lab2.hostfile), "--detach",
                    "--master-port", port)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "preflight failed" in done.stderr and "master port not free" in done.stderr, done.stderr
    assert done.stdout == "", done.stdout
    [row] = runs(home, tmp_path)
    assert (row["state"], row["exit_code"]) == ("failed", 2), row
    clean, _, left = lab2.wait_clean(10)
    assert clean, left
    missing = write_job(lab2, str(tmp_path / "missing.py"), name="missing")
    local = cddp(home, tmp_path, "run", str(missing), "--hostfile", str(lab2.hostfile), "--detach")
    assert local.returncode == 2 and local.stderr.count("\n") == 1 and "no such file" in local.stderr, local.stderr
