"""`clusterddp doctor` on real hosts: the table on one node and on 4 SSH hosts, one of them throttled."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import cli, cli_env
from tests.diagnose.conftest import REPO, assert_clean, write_job
from tests.testbed import SSHLab

TBF = ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]
ROW = re.compile(r"^\s+(\d+)\s+(cdssh\d)\s+.*?([\d.]+x)(.*)$")


@pytest.mark.slow
def test_doctor_on_this_node(tmp_path: Path) -> None:
    """Without a hostfile the doctor runs locally and prints the all_reduce table with busbw."""
    result = cli("doctor", str(REPO / "jobs" / "hello.yaml"), cwd=tmp_path, env=cli_env())
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all_reduce across all 2 ranks (1 node(s) x 2" in result.stdout
    assert re.search(r"bus bandwidth: [\d.]+ [kMG]B/s \(all_reduce of 1 MiB\)", result.stdout)
    assert "no node stands out" in result.stdout


@pytest.mark.ssh
@pytest.mark.slow
def test_doctor_flags_the_throttled_host(lab4: SSHLab, tmp_path: Path) -> None:
    """4 hosts, cdssh4's link limited by tbf to 20 mbit: the table lists every node and flags only cdssh4."""
    job = write_job(lab4, REPO / "jobs" / "hello.py", name="doc", nproc_per_node=1)
    throttled = lab4.host("cdssh4")
    tc = lab4.run_in(throttled, TBF, capture_output=True, text=True)
    assert tc.returncode == 0, tc.stderr
    started = time.monotonic()
    result = cli("doctor", str(job), "--hostfile", str(lab4.hostfile), cwd=tmp_path, env=cli_env(), timeout=180)
    seconds = time.monotonic() - started
    print(f"doctor on 4 hosts (cdssh4 throttled) took {seconds:.1f}s:\n{result.stdout}")
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {m.group(2): m for m in (ROW.match(line) for line in result.stdout.splitlines()) if m}
    assert sorted(rows) == ["cdssh1", "cdssh2", "cdssh3", "cdssh4"], result.stdout
    assert "SLOW" in rows["cdssh4"].group(4), result.stdout
    assert not any("SLOW" in rows[h].group(4) for h in ("cdssh1", "cdssh2", "cdssh3")), result.stdout
    assert "slow node(s): cdssh4 " in result.stdout
    assert re.search(r"preflight \(4 nodes.*\n(.*\n){1}(\s+\d\s+cdssh\d .*eth0.*\n){4}", result.stdout), result.stdout
    assert "all_reduce across all 4 ranks (4 node(s) x 1, backend gloo)" in result.stdout
    assert_clean(lab4, 5)
