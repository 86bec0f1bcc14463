"""On 4 real SSH hosts x 1 worker: the head names the slow host, merges the same line across hosts, and hang_timeout: auto stops a stuck rank."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import cli, cli_env
from tests.diagnose.conftest import assert_clean, write_job
from tests.testbed import SSHLab


@pytest.mark.ssh
@pytest.mark.slow
def test_head_names_the_slow_host_and_merges_across_hosts(lab4: SSHLab, tmp_path: Path) -> None:
    """Rank 2 (cdssh3) computes 2x from step 25: one straggler line naming cdssh3 within 10 s, its event; the same line of 4 hosts shown once."""
    job = write_job(lab4, "slow_compute.py", name="slow", nproc_per_node=1,
                    args=["steps=90", "compute=0.1", "slow_rank=2", "slow_from=25"],
                    logs={"dir": str(tmp_path / "logs")})
    result = cli("run", str(job), "--hostfile", str(lab4.hostfile), "--run-id", "slow", cwd=tmp_path,
                 env=cli_env(CLUSTERDDP_NO_MERGE="0"), timeout=240)
    lines = [line for line in result.stderr.splitlines() if "straggler:" in line]
    onset = float(re.search(r"slow from step 25 t=([0-9.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    events = [json.loads(line) for line in (tmp_path / "logs" / "slow" / "events.jsonl").read_text().splitlines()]
    found = [e for e in events if e["kind"] == "straggler"]
    print(f"straggler over SSH: {lines}; {found[0]['t'] - onset if found else None:.1f}s after onset")
    assert result.returncode == 0, result.stderr
    assert lines == ["clusterddp: straggler: host cdssh3 (rank 2) 2.0x the median step compute"], result.stderr
    assert len(found) == 1 and found[0]["slow_host"] == "cdssh3" and found[0]["t"] - onset < 10.0
    assert result.stdout.count("rank 0 done") == 1  # its own line, as before
    assert "[ranks 0-3] finished\n" in result.stdout, result.stdout[-2000:]  # one line from 4 hosts
    assert_clean(lab4, 5)


@pytest.mark.ssh
@pytest.mark.slow
def test_auto_hang_across_hosts_names_the_stuck_rank(lab4: SSHLab, tmp_path: Path) -> None:
    """hang_timeout: auto, rank 3 (cdssh4) stuck at step 20: exit 124, the report names rank 3 on cdssh4 in phase train."""
    job = write_job(lab4, "slow_compute.py", name="stuck", nproc_per_node=1, hang_timeout="auto",
                    args=["steps=1000", "compute=0.05", "stuck_rank=3", "stuck_at=20"],
                    logs={"dir": str(tmp_path / "logs")})
    result = cli("run", str(job), "--hostfile", str(lab4.hostfile), cwd=tmp_path, env=cli_env(), timeout=240)
    print(result.stderr[-3000:])
    assert result.returncode == 124, result.stderr
    # cdssh4's own launcher sees its rank outside any collective (unannounced work, not a hang);
    # the hosts whose ranks wait declare it, and the head's verdict names the stuck rank.
    assert re.search(r"stuck: rank 3 on cdssh4 in phase train|rank\(s\) 3 on cdssh4 not in a collective "
                     r"while rank\(s\) 0-2 wait in one; rank 3 in phase train", result.stderr), result.stderr
    assert re.search(r"verdict: .*rank\(s\) 3 on cdssh4 not in a collective.*; rank 3 in phase train", result.stderr)
    assert_clean(lab4, 5)
