"""Real SLURM: rendered sbatch scripts run on slurmctld + 2 slurmd nodes in network namespaces.

The cluster (tests/testbed/slurm_cluster.py) is real: munged, slurmctld, slurmd, sbatch,
srun and torch gloo DDP across the namespaces. Jobs are submitted with the real CLI
('clusterddp submit slurm'), so the renderer, the template, SlurmEnv and the launcher are
all exercised together.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.conftest import REPO, cli_env
from tests.testbed.slurm_cluster import SlurmCluster, slurm_cluster, unavailable_reason

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]

BIN = Path(__file__).parent / "bin"
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
#: The interface inside each node's namespace: gloo must advertise it, not 127.0.0.1.
JOB_ENV = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    with slurm_cluster(2, base_env=cli_env()) as running:
        yield running


def write_job(directory: Path, name: str, script: Path, args: list[str] | None = None, **extra: object) -> Path:
    data: dict[str, object] = {"name": name, "script": str(script), "args": args or [], "nodes": 2,
                               "nproc_per_node": 2, "grace_period": 2, "env": JOB_ENV,
                               "python": sys.executable, **extra}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def submit(cluster: SlurmCluster, job: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "clusterddp", "submit", "slurm", str(job)], cwd=job.parent,
                            env=cluster.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert job_id.isdigit(), result.stdout
    assert f"logs/{job.stem}-{job_id}.out" in result.stderr
    return job_id


def batch_log(job: Path, job_id: str) -> str:
    return (job.parent / "logs" / f"{job.stem}-{job_id}.out").read_text(errors="replace")


def test_hello_two_nodes_two_workers(cluster: SlurmCluster, tmp_path: Path) -> None:
    """A 2-node x 2-worker gloo job ends COMPLETED with ranks 0-1 on node 1 and 2-3 on node 2."""
    job = write_job(tmp_path, "hello", REPO / "jobs" / "hello.py")
    started = time.monotonic()
    job_id = submit(cluster, job)
    info = cluster.wait_state(job_id, DONE, timeout=180)
    log = batch_log(job, job_id)
    assert info["JobState"] == "COMPLETED", log
    assert info["NodeList"] == "cdslurm[1-2]"
    found = {int(rank): host for rank, host in
             re.findall(r"hello from rank (\d)/4 \(local rank \d\) on (\S+): all_reduce sum 6 == 6", log)}
    assert found == {0: "cdslurm1", 1: "cdslurm1", 2: "cdslurm2", 3: "cdslurm2"}, log
    assert cluster.wait_clean(10) == {}
    print(f"hello job: submit to COMPLETED in {time.monotonic() - started:.1f}s")


def test_worker_failure_on_node_two(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Rank 3 exiting 3 on node 2: job FAILED, root cause named in the log, nothing left on any node."""
    job = write_job(tmp_path, "failing", BIN / "fail_on_last_node.py")
    job_id = submit(cluster, job)
    info = cluster.wait_state(job_id, DONE, timeout=180)
    log = batch_log(job, job_id)
    assert info["JobState"] == "FAILED", log
    assert re.search(r"root cause.*\n\s+host:\s+cdslurm2\n\s+rank:\s+3 ", log), log
    assert "exit code 3" in log
    left = cluster.wait_clean(15)
    assert left == {}, f"processes left on nodes: {left}"


def test_preemption_checkpoint_requeue_resume(cluster: SlurmCluster, tmp_path: Path) -> None:
    """USR1 to the batch shell: checkpoint, exit 75, requeue, resume; final weights equal an uninterrupted run."""
    import torch

    runs = {}
    for kind in ("reference", "preempted"):
        work = tmp_path / kind
        (work / "ckpt").mkdir(parents=True)
        args = ["--steps", "30", "--step-sleep", "0.2", "--ckpt", str(work / "ckpt"), "--out", str(work / "final.pt")]
        runs[kind] = (work, write_job(work, f"train-{kind}", BIN / "preempt_train.py", args))

    ref_dir, ref_job = runs["reference"]
    ref_id = submit(cluster, ref_job)
    assert cluster.wait_state(ref_id, DONE, timeout=240)["JobState"] == "COMPLETED", batch_log(ref_job, ref_id)

    work, job = runs["preempted"]
    job_id = submit(cluster, job)
    progress = work / "ckpt" / "progress"
    deadline = time.monotonic() + 120
    while not (progress.exists() and progress.read_text().strip() and int(progress.read_text()) >= 5):
        assert time.monotonic() < deadline, batch_log(job, job_id)
        time.sleep(0.1)
    signalled = time.monotonic()
    cluster.command("scancel", "--signal=USR1", "--batch", job_id)
    requeued = cluster.wait_state(job_id, ("PENDING", *DONE), timeout=120)
    assert requeued["JobState"] == "PENDING" and requeued["Restarts"] == "1", batch_log(job, job_id)
    info = cluster.wait_state(job_id, DONE, timeout=240)
    log = batch_log(job, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    stopped_at = int(re.search(r"preempted: checkpoint at step (\d+), exiting 75", log).group(1))
    assert 5 <= stopped_at < 30
    assert f"resumed from step {stopped_at} (SLURM_RESTART_COUNT=1)" in log
    assert "requeueing job" in log
    reference = torch.load(ref_dir / "final.pt")
    resumed = torch.load(work / "final.pt")
    assert reference.keys() == resumed.keys()
    for key in reference:
        assert torch.equal(reference[key], resumed[key]), key
    assert cluster.wait_clean(10) == {}
    print(f"preemption: signal to COMPLETED after requeue in {time.monotonic() - signalled:.1f}s")


def test_run_in_a_hand_written_batch_script_fans_out(cluster: SlurmCluster, tmp_path: Path) -> None:
    """'clusterddp run JOB' called directly in an sbatch script relaunches itself once per node with srun."""
    job = write_job(tmp_path, "direct", REPO / "jobs" / "hello.py")
    script = tmp_path / "direct.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"
                      f"#SBATCH --output={tmp_path}/direct-%j.out\n"
                      f"{sys.executable} -m clusterddp run {job}\n")
    out = cluster.command("sbatch", "--parsable", str(script), cwd=tmp_path)
    job_id = out.stdout.strip()
    info = cluster.wait_state(job_id, DONE, timeout=180)
    log = (tmp_path / f"direct-{job_id}.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", log
    ranks = sorted(int(r) for r in re.findall(r"hello from rank (\d)/4", log))
    assert ranks == [0, 1, 2, 3], log  # 4 workers: one launcher per node, not one per task
