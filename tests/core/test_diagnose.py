"""Where is each rank: the worker bootstrap, stack grouping, `clusterddp stacks`, hang_timeout."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from clusterddp.stackreport import format_ranks, group_report, locate, parse_dump
from clusterddp.launch.start import bootstrap
from tests.conftest import BIN, cli, start_cli, wait_for, write_job

DUMP = '''Thread 0x00007f7033beb6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f7034a0db80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/home/u/train.py", line 88 in step
  File "/home/u/train.py", line 120 in <module>
  File "/venv/lib/python3.11/site-packages/clusterddp/launch/start/bootstrap.py", line 70 in run_script
  File "/venv/lib/python3.11/site-packages/clusterddp/launch/start/bootstrap.py", line 80 in <module>
'''


def test_parse_and_locate_a_faulthandler_dump() -> None:
    """The main thread is found, bootstrap frames dropped, the collective recognised."""
    threads = parse_dump(DUMP)
    assert len(threads) == 2 and threads[1].current
    where = locate(DUMP)
    assert where.summary == "in all_reduce (distributed_c10d.py:2501) <- step (train.py:88)"
    assert where.in_collective


def test_group_report_flags_the_odd_rank() -> None:
    """Identical stacks are grouped; the rank outside any collective comes first, flagged."""
    stuck = DUMP.replace("distributed_c10d.py\", line 2501 in all_reduce", "data.py\", line 12 in load_batch") \
        .replace("/venv/lib/python3.11/site-packages/torch/distributed/", "/home/u/")
    lines = group_report({0: locate(DUMP), 1: locate(DUMP), 2: locate(DUMP), 3: locate(stuck)})
    assert lines[0].startswith("rank 3: in load_batch (data.py:12)") and "likely holding the others" in lines[0]
    assert lines[1].startswith("ranks 0-2: in all_reduce")


@pytest.mark.parametrize("ranks,text", [([0], "0"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([6, 0, 1], "0-1,6")])
def test_format_ranks(ranks: list[int], text: str) -> None:
    """Rank lists print as compact ranges."""
    assert format_ranks(ranks) == text


def test_bootstrap_is_invisible_to_the_script(tmp_path: Path) -> None:
    """Through the bootstrap a script sees the same argv, __file__, __name__ and sys.path[0]."""
    script = BIN / "argv_main.py"
    rel = str(script.relative_to(Path.cwd())) if script.is_relative_to(Path.cwd()) else str(script)
    direct = subprocess.run([sys.executable, rel, "a b", "'c'"], capture_output=True, text=True, check=True)
    booted = subprocess.run([sys.executable, bootstrap.__file__, rel, "a b", "'c'"],
                            capture_output=True, text=True, check=True)
    assert json.loads(direct.stdout) == json.loads(booted.stdout)


@pytest.mark.slow
def test_stacks_on_demand_and_the_job_goes_on(job_dir: Path) -> None:
    """`clusterddp stacks` on a running 4-rank job prints every rank's stack; training continues."""
    job = write_job(job_dir, script="step_loop.py", args=["-1"], nproc_per_node=4)
    proc = start_cli("run", str(job), "--run-id", "live")
    run = job_dir / "logs" / "live"
    try:
        assert wait_for(lambda: all("step 1" in (run / f"rank{r}.log").read_text()
                                    for r in range(4) if (run / f"rank{r}.log").exists())
                        and len(list(run.glob("rank*.log"))) == 4, timeout=120)
        result = cli("stacks", "live", "--log-dir", str(job_dir / "logs"))
        assert result.returncode == 0, result.stderr
        assert "ranks 0-3:" in result.stdout or all(f"rank {r}" in result.stdout for r in range(4))
        assert result.stdout.count("===== rank") == 4
        for name, junk in (("broken", b"{"), ("binary", b"\xff\x00"), ("zero-pid", b'{"pid": 0}')):
            (job_dir / "logs" / name).mkdir()  # newer than the live run: searched first
            (job_dir / "logs" / name / "launcher.json").write_bytes(junk)
        newest = cli("stacks", "--log-dir", str(job_dir / "logs"))  # no run id: the newest live run
        assert newest.returncode == 0, newest.stderr
        assert newest.stdout.count("===== rank") == 4
        assert newest.stderr.count("clusterddp: skipped ") == 3, newest.stderr
        steps_then = (run / "rank0.log").read_text().count(" step ")
        assert wait_for(lambda: (run / "rank0.log").read_text().count(" step ") > steps_then + 2, timeout=60)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=600)


@pytest.mark.slow
def test_hang_timeout_names_the_stuck_rank(job_dir: Path) -> None:
    """Rank 3 stuck in data loading, 0-2 in all_reduce: reported, torn down, exit 124."""
    # hang_timeout counts from the start too: long enough for 4 imports of torch on a loaded machine
    job = write_job(job_dir, script="step_loop.py", args=["3"], nproc_per_node=4, hang_timeout=30, grace_period=1)
    result = cli("run", str(job), timeout=600)
    assert result.returncode == 124, result.stderr[-3000:]
    assert "rank 3: in load_batch (step_loop.py:" in result.stderr
    assert "ranks 0-2: in all_reduce" in result.stderr
    assert "rank(s) 3 not in a collective" in result.stderr
    marked = [p for p in psutil.process_iter(["cmdline"]) if "step_loop.py" in " ".join(p.info["cmdline"] or [])]
    assert not marked
