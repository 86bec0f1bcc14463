"""Where each rank is, across hosts: `clusterddp stacks` and hang_timeout on a real 2-host SSH lab."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import cli, cli_env
from tests.diagnose.conftest import assert_clean, wait_stderr, write_job
from tests.testbed import SSHLab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

RANK_LINE = re.compile(r"^\s*ranks? ([\d,-]+) \((cdssh\d(?:, cdssh\d)*)\): (.*)$")


def _ranks_in(text: str) -> dict[int, tuple[str, str]]:
    """rank -> (hosts, summary) from merged report lines like 'ranks 0-2 (cdssh1, cdssh2): in ...'."""
    found: dict[int, tuple[str, str]] = {}
    for line in text.splitlines():
        match = RANK_LINE.match(line)
        if not match:
            continue
        for part in match.group(1).split(","):
            first, _, last = part.partition("-")
            for rank in range(int(first), int(last or first) + 1):
                found[rank] = (match.group(2), match.group(3))
    return found


def test_stacks_on_demand_across_two_hosts(lab2: SSHLab, head_factory, tmp_path: Path) -> None:
    """`clusterddp stacks` on a running 2-host x 2-rank job prints all 4 ranks; the job goes on."""
    job = write_job(lab2, "step_loop.py", args=["-1"])
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile), "--run-id", "live2")
    head.wait_for(r"rank 3 step 2", timeout=120)
    head.wait_for(r"rank 0 step 2", timeout=30)
    asked = time.monotonic()
    result = cli("stacks", "live2", "--log-dir", str(tmp_path / "logs"), cwd=tmp_path, env=cli_env())
    seconds = time.monotonic() - asked
    print(f"clusterddp stacks across 2 hosts answered in {seconds:.2f}s:\n{result.stdout}")
    assert result.returncode == 0, result.stderr + head.output()
    where = _ranks_in(result.stdout)
    assert sorted(where) == [0, 1, 2, 3], result.stdout
    assert all("step_loop.py" in summary for _, summary in where.values()), result.stdout
    for host in ("cdssh1", "cdssh2"):
        dump = re.search(rf"^\s+{host}: (\S+stacks-\S+\.txt)$", result.stdout, re.M)
        assert dump and Path(dump.group(1)).is_file(), result.stdout  # shared filesystem in the lab
        assert "===== rank" in Path(dump.group(1)).read_text()
    assert not any("CLUSTERDDP_STACKS" in line for line in head.stdout + head.stderr), head.output()
    steps = len(head.wait_for(r"rank 0 step \d+"))
    head.wait_for(r"rank 0 step \d+", count=steps + 3, timeout=60)  # the job goes on
    assert head.proc.poll() is None
    head.signal(signal.SIGTERM)
    assert head.finish(60) == 128 + signal.SIGTERM, head.output()
    assert_clean(lab2, 10)


def test_hang_across_two_hosts_names_the_stuck_rank(lab2: SSHLab, head_factory) -> None:
    """Rank 3 sleeps in load_batch, 0-2 wait in all_reduce: named within 20 s, exit 124, nothing left."""
    job = write_job(lab2, "step_loop.py", args=["3"], hang_timeout=10)
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile))
    head.wait_for(r"rank 3 step 2", timeout=120)
    stuck_since = time.monotonic()  # rank 3 enters load_batch for step 3 and never leaves
    title, reported = wait_stderr(head, r"where each rank is: .*\(hang", timeout=600)
    code = head.finish(60)
    after = reported - stuck_since
    cleaned = assert_clean(lab2, 10)
    stderr = "\n".join(head.stderr)
    print(f"hang across 2 hosts: merged report {after:.1f}s after rank 3 got stuck (hang_timeout 10); "
          f"head exited {code}; hosts clean {cleaned:.2f}s after the head\n{stderr}")
    report = stderr[stderr.index(title):]
    where = _ranks_in(report)
    assert where[3][0] == "cdssh2" and where[3][1].startswith("in load_batch (step_loop.py:"), report
    assert "not in a collective" in where[3][1], report
    assert all(where[r][1].startswith("in all_reduce (") for r in (0, 1, 2)), report
    assert re.search(r"ranks 0-2 \(cdssh1, cdssh2\): in all_reduce", report), report
    assert "rank(s) 3 on cdssh2 not in a collective while rank(s) 0-2 wait in one" in stderr, stderr
    assert after <= 20, f"reported {after:.1f}s after the hang began"
    assert code == 124, head.output()
    assert not any(line.startswith("CLUSTERDDP_") for line in head.stdout), head.output()
