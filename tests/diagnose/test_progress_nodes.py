"""Two headless launchers (node 0 and node 1, as srun starts them) sharing a run dir: node 0 judges both nodes' ranks."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import cli_env, write_job
from tests.train.rankrun import free_port


def start_nodes(job: Path, cwd: Path) -> list[subprocess.Popen[str]]:
    port = str(free_port())
    return [subprocess.Popen([sys.executable, "-m", "clusterddp", "run", str(job), "--nnodes", "2", "--node-rank",
                              str(node), "--master-addr", "127.0.0.1", "--master-port", port, "--run-id", "nodes"],
                             cwd=cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node in (0, 1)]


def test_node0_names_the_slow_rank_of_node1_and_node1_waits_out_node0s_checkpoint(tmp_path: Path) -> None:
    """Rank 1 (node 1) at 2x from step 25, a 6 s checkpoint on rank 0: node 0 names rank 1 once, no hang anywhere."""
    job = write_job(tmp_path, script="slow_compute.py", nproc_per_node=1, hang_timeout="auto",
                    args=["steps=70", "compute=0.1", "slow_rank=1", "slow_from=25", "ckpt_every=12", "ckpt_x=60"])
    nodes = start_nodes(job, tmp_path)
    (out0, err0), (out1, err1) = (node.communicate(timeout=240) for node in nodes)
    assert [node.returncode for node in nodes] == [0, 0], err0 + err1
    lines = [line for line in err0.splitlines() if "straggler:" in line]
    assert len(lines) == 1 and re.search(r"straggler: host \S+ \(rank 1\) [12]\.\dx the median step compute", lines[0])
    assert "straggler" not in err1 and "hang" not in err0 + err1 and "sees no progress" not in err0


def test_auto_hang_on_node0_names_the_stuck_rank_on_node1(tmp_path: Path) -> None:
    """Rank 1 (node 1) stuck at step 20: node 0 exits 124 naming rank 1 and its phase; node 1 leaves the verdict to node 0."""
    job = write_job(tmp_path, script="slow_compute.py", nproc_per_node=1, hang_timeout="auto", grace_period=1,
                    args=["steps=1000", "compute=0.05", "stuck_rank=1", "stuck_at=20"])
    nodes = start_nodes(job, tmp_path)
    _, err0 = nodes[0].communicate(timeout=180)
    nodes[1].send_signal(signal.SIGTERM)  # what srun's --kill-on-bad-exit does
    _, err1 = nodes[1].communicate(timeout=600)
    assert nodes[0].returncode == 124, err0
    assert re.search(r"rank\(s\) 0 on \S+ wait in a collective; stuck: rank 1 on \S+ in phase train \(entered \d+s "
                     r"ago\), no step for \d+s \(last step recorded \d+\)", err0), err0
    assert "hang:" not in err1, err1
