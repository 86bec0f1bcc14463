"""Real SLURM: rendered sbatch scripts run on slurmctld + 2 slurmd nodes in network namespaces.

The cluster (tests/testbed/slurm_cluster.py) is real: munged, slurmctld, slurmd, sbatch,
srun and torch gloo DDP across the namespaces. Jobs are submitted with the real CLI
('clusterddp submit slurm'), so the renderer, the template, SlurmEnv and the launcher are
all exercised together.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.conftest import REPO, cli_env
from tests.testbed import spank
from tests.testbed.patience import patient
from tests.testbed.slurm_cluster import SlurmCluster, SlurmNode, slurm_cluster, unavailable_reason

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
                            env=cluster.env, capture_output=True, text=True, timeout=600)
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


def test_scancel_reaches_every_rank_as_sigterm(cluster: SlurmCluster, tmp_path: Path) -> None:
    """scancel of a running job: every rank gets SIGTERM (its handler runs, no KeyboardInterrupt), nothing left."""
    out = tmp_path / "stopped"
    out.mkdir()
    job = write_job(tmp_path, "cancelled", REPO / "tests" / "bin" / "keyboard_interrupt.py", args=[str(out)])
    job_id = submit(cluster, job)
    deadline = time.monotonic() + 180
    while len(list(out.glob("rank*.ready"))) < 4:
        assert time.monotonic() < deadline, batch_log(job, job_id)
        time.sleep(0.1)
    cluster.command("scancel", job_id)
    info = cluster.wait_state(job_id, DONE, timeout=120)
    assert info["JobState"] == "CANCELLED", batch_log(job, job_id)
    assert sorted(p.name for p in out.glob("rank*.terminated")) == [f"rank{r}.terminated" for r in range(4)], \
        batch_log(job, job_id)
    assert not list(out.glob("rank*.interrupted"))
    assert cluster.wait_clean(15) == {}


#: jobs/cifar10.py, small: ResNet-18 of width 8 on generated images, no loader processes
#: (a mid-epoch resume is then exact), checkpoints in OUT/checkpoints/last.pt.
CIFAR10 = REPO / "jobs" / "cifar10.py"


def cifar10_args(out: Path, epochs: int, train_images: int) -> list[str]:
    return ["--epochs", str(epochs), "--width", "8", "--batch-size", "8", "--synthetic-train", str(train_images),
            "--synthetic-test", "64", "--workers", "0", "--out-dir", str(out)]


def wait_for_file(path: Path, job: Path, job_id: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path} after {timeout}s\n" + batch_log(job, job_id)
        time.sleep(0.05)


def model_state(checkpoint: Path) -> dict[str, object]:
    import torch

    return dict(torch.load(checkpoint, weights_only=True)["model"])


def test_preemption_checkpoint_requeue_resume(cluster: SlurmCluster, tmp_path: Path) -> None:
    """USR1 to the batch shell of a 4-rank clusterddp.train job: fit checkpoints mid-epoch, exit 75,
    requeue, resume; the final weights are torch.equal to an uninterrupted run's."""
    import torch

    runs = {}
    for kind in ("reference", "preempted"):
        (tmp_path / kind).mkdir()
        out = tmp_path / kind / "out"
        runs[kind] = (out, write_job(tmp_path / kind, f"train-{kind}", CIFAR10, cifar10_args(out, 2, 512)))
    ref_out, ref_job = runs["reference"]
    started = time.monotonic()
    ref_id = submit(cluster, ref_job)
    assert cluster.wait_state(ref_id, DONE, timeout=300)["JobState"] == "COMPLETED", batch_log(ref_job, ref_id)
    reference_s = time.monotonic() - started

    out, job = runs["preempted"]
    started = time.monotonic()
    job_id = submit(cluster, job)
    checkpoint = out / "checkpoints" / "last.pt"
    wait_for_file(checkpoint, job, job_id)  # epoch 1 is done: preempt during epoch 2
    signalled = time.monotonic()
    cluster.command("scancel", "--signal=USR1", "--batch", job_id)
    requeued = cluster.wait_state(job_id, ("PENDING", *DONE), timeout=120)
    assert requeued["JobState"] == "PENDING" and requeued["Restarts"] == "1", batch_log(job, job_id)
    requeued_s = time.monotonic() - signalled
    info = cluster.wait_state(job_id, DONE, timeout=300)
    log = batch_log(job, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    assert "srun: forcing job termination" not in log
    stop = re.search(r"clusterddp\.train: preempted by .*SIGUSR1 on rank \d.* at epoch (\d+) step (\d+); "
                     rf"checkpoint {re.escape(str(checkpoint.parent))}/ckpt-\d+\.pt; exiting with code 75", log)
    assert stop, log
    epoch, step = int(stop.group(1)), int(stop.group(2))
    assert epoch == 1 and 0 < step < 512 // (8 * 4), stop.group(0)  # mid-epoch
    assert re.search(rf"requeueing job {job_id}\n", log), log
    assert re.search(rf"\] resumed from {re.escape(str(checkpoint.parent))}/ckpt-\d+\.pt at epoch {epoch} step {step}\n", log), log
    reference, resumed = model_state(ref_out / "checkpoints" / "last.pt"), model_state(checkpoint)
    assert reference.keys() == resumed.keys()
    for key in reference:
        assert torch.equal(reference[key], resumed[key]), key  # type: ignore[arg-type]
    assert cluster.wait_clean(10) == {}
    print(f"preemption: uninterrupted run {reference_s:.1f}s; preempted run: submit to signal "
          f"{signalled - started:.1f}s, signal to requeued {requeued_s:.1f}s, signal to COMPLETED "
          f"{time.monotonic() - signalled:.1f}s (stopped at epoch {epoch} step {step})")


def launcher_pid(cluster: SlurmCluster, node: SlurmNode, job: Path) -> int:
    """The clusterddp launcher of ``job`` on ``node``: in the node's network namespace, running
    ``-m clusterddp run JOB``, and not a fork of another one (its reaper has the same command line)."""
    def cmdline(pid: int) -> list[str]:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return []

    def is_launcher(pid: int) -> bool:
        words = cmdline(pid)
        return "clusterddp" in words and "run" in words and str(job) in words

    def parent(pid: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    found = [pid for pid in cluster.node_processes(node) if is_launcher(pid) and not is_launcher(parent(pid))]
    assert len(found) == 1, (found, [cmdline(p) for p in cluster.node_processes(node)])
    return found[0]


def test_killed_node_launcher_restarts_the_step_in_the_allocation(cluster: SlurmCluster, tmp_path: Path) -> None:
    """restarts: 1, node 2's launcher killed -9 after the first checkpoint: exactly one srun step
    restart inside the allocation, resumed from the checkpoint, COMPLETED, nothing left on a node."""
    out = tmp_path / "out"
    job = write_job(tmp_path, "restart", CIFAR10, cifar10_args(out, 3, 512), restarts=1, nproc_per_node=1)
    started = time.monotonic()
    job_id = submit(cluster, job)
    checkpoint = out / "checkpoints" / "last.pt"
    wait_for_file(checkpoint, job, job_id)
    pid = launcher_pid(cluster, cluster.nodes[1], job)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    log_path = job.parent / "logs" / f"{job.stem}-{job_id}.out"
    restart_line = re.compile(r"clusterddp: attempt 0 ended with exit status (\d+); left out: none; "
                              r"restart 1 of 1 in 1s on 2 node\(s\): cdslurm1,cdslurm2\n")
    while not restart_line.search(log_path.read_text(errors="replace")):
        assert time.monotonic() - killed < 600, batch_log(job, job_id)  # a deadline, not a speed claim
        time.sleep(0.05)
    restarted = time.monotonic()
    resumed_line = re.compile(rf"\] resumed from {re.escape(str(checkpoint.parent))}/ckpt-\d+\.pt at epoch (\d+) step (\d+)\n")
    while not resumed_line.search(log_path.read_text(errors="replace")):
        assert time.monotonic() - killed < 600, batch_log(job, job_id)
        time.sleep(0.05)
    resumed = time.monotonic()
    info = cluster.wait_state(job_id, DONE, timeout=300)
    log = batch_log(job, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", log
    assert len(restart_line.findall(log)) == 1 and log.count("restart 1 of 1") == 1, log
    failed_with = restart_line.findall(log)[0]
    assert failed_with != "0"
    report = re.findall(r"clusterddp: final report: attempt (\d) on 2 node\(s\) (\S+): exit status (\d+) after", log)
    assert [(attempt, status) for attempt, _, status in report] == [("0", failed_with), ("1", "0")], log
    assert report[1][1] == "cdslurm1,cdslurm2"
    (epoch, step), = resumed_line.findall(log)
    assert "epoch 3/3: train loss" in log
    assert cluster.wait_clean(15) == {}
    print(f"in-allocation restart: submit to kill {killed - started:.1f}s; kill -9 of node 2's launcher (step "
          f"exit status {failed_with}) to the restart line {restarted - killed:.1f}s, to 'resumed from' "
          f"{resumed - killed:.1f}s (epoch {epoch} step {step}); COMPLETED {time.monotonic() - started:.1f}s "
          "after submit")


def test_drained_node_is_left_out_of_the_restart_when_min_allows(cluster: SlurmCluster, tmp_path: Path) -> None:
    """nodes "1:2", restarts 1: node 2 drained and its launcher killed -9 after the first
    checkpoint; the restart runs on node 1 alone (1 rank), resumes and ends COMPLETED."""
    out = tmp_path / "out"
    job = write_job(tmp_path, "elastic", CIFAR10, cifar10_args(out, 3, 512), nodes="1:2", restarts=1,
                    nproc_per_node=1)
    deadline = time.monotonic() + patient(60)  # SLURM starts a MIN-MAX job on the nodes free then: free both
    while cluster.command("sinfo", "-h", "-N", "-o", "%T").stdout.split() != ["idle", "idle"]:
        assert time.monotonic() < deadline, cluster.command("sinfo", "-N").stdout
        time.sleep(0.2)
    started = time.monotonic()
    job_id = submit(cluster, job)
    wait_for_file(out / "checkpoints" / "last.pt", job, job_id)
    assert cluster.job(job_id)["NodeList"] == "cdslurm[1-2]"
    try:
        cluster.command("scontrol", "update", "nodename=cdslurm2", "state=drain", "reason=clusterddp-test")
        os.kill(launcher_pid(cluster, cluster.nodes[1], job), signal.SIGKILL)
        killed = time.monotonic()
        info = cluster.wait_state(job_id, DONE, timeout=300)
    finally:
        cluster.command("scontrol", "update", "nodename=cdslurm2", "state=resume")
    log = batch_log(job, job_id)
    assert info["JobState"] == "COMPLETED", log
    assert re.search(r"clusterddp: attempt 0 ended with exit status \d+; left out: cdslurm2 \((MIXED|ALLOCATED|IDLE)"
                     r"\+DRAIN\); restart 1 of 1 in 1s on 1 node\(s\): cdslurm1\n", log), log
    assert re.search(r"clusterddp: final report: attempt 1 on 1 node\(s\) cdslurm1: exit status 0 after", log), log
    assert re.search(r"\] CIFAR-10 not found .* 1 rank\(s\) on cpu", log), log
    assert re.search(r"\] resumed from .* at epoch \d+ step \d+\n", log), log
    assert cluster.wait_clean(15) == {}
    print(f"drained node left out: kill to COMPLETED {time.monotonic() - killed:.1f}s, job {time.monotonic() - started:.1f}s")


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


@pytest.fixture(scope="module")
def failspank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """failspank.so, built with gcc from tests/slurm/spank/failspank.c (skipped without gcc or libslurm-dev)."""
    reason = spank.build_unavailable()
    if reason:
        pytest.skip(reason)
    return spank.build_failspank(tmp_path_factory.mktemp("failspank"))


def test_a_step_whose_tasks_never_launch_fails_the_job(cluster: SlurmCluster, failspank: Path, tmp_path: Path) -> None:
    """A SPANK plugin stops every task's launch and srun exits 0: the attempt fails naming both nodes,
    the plugin's own error (only in slurmd's log) and srun's; restarts: 3 runs it once more, and since
    it failed the same way on every node before any worker ran, not a third time: the job ends
    FAILED with exit 1, not COMPLETED."""
    job = write_job(tmp_path, "nolaunch", REPO / "jobs" / "hello.py", restarts=3)
    with spank.plugin_added(cluster.conf, f"required {failspank}"):
        job_id = submit(cluster, job)
        info = cluster.wait_state(job_id, DONE, timeout=120)
    log = batch_log(job, job_id)
    print("".join(line + "\n" for line in log.splitlines() if line.startswith("clusterddp:")), end="")
    print(f"job {job_id}: JobState={info['JobState']} ExitCode={info['ExitCode']}")
    assert spank.LAUNCH_FAILED in log, log
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", log
    never = (r"clusterddp: attempt {}: the launcher never started on 2 of 2 node\(s\): cdslurm1,cdslurm2: "
             r"failspank: refusing to start the task \(slurmd's log on cdslurm1\); "
             r"srun exited 0; srun's last error: srun: error: task \d " + re.escape(spank.LAUNCH_FAILED) + "\n")
    assert re.search(never.format(0), log) and re.search(never.format(1), log), log
    assert ("clusterddp: attempt 0 ended with exit status 1; left out: none; restart 1 of 3 in 1s on 2 node(s): "
            "cdslurm1,cdslurm2\n") in log
    assert ("clusterddp: attempt 1 ended with exit status 1; not restarting: the launch failed on every node before "
            "any worker ran, the same way as attempt 0 (failspank: refusing to start the task): it will fail the same "
            "way again (restart_on.deterministic: true retries it)\n") in log, log
    assert "clusterddp: attempt 2" not in log
    assert re.search(r"clusterddp: final report: attempt 1 on 2 node\(s\) cdslurm1,cdslurm2: exit status 1 after", log)
    assert "hello from rank" not in log
    assert cluster.wait_clean(10) == {}


def test_a_missing_container_image_is_not_restarted(cluster: SlurmCluster, tmp_path: Path) -> None:
    """container.image a bundle path that does not exist, runtime oci (SLURM's own support, oci.conf
    with runc), restarts: 3: no launcher starts on either node; the attempt's line quotes why, and
    the same launch failing the same way twice ends the job FAILED after attempt 1, not after 3."""
    from tests.testbed import containers
    if containers.unavailable_reason():
        pytest.skip(str(containers.unavailable_reason()))
    missing = tmp_path / "no-such-bundle"
    job = write_job(tmp_path, "noimage", REPO / "jobs" / "hello.py", restarts=3,
                    container={"runtime": "oci", "image": str(missing)})
    # slurmstepd 22.05 crashes on the missing config.json after logging it: no core file in its cwd.
    limits = {node.slurmd_pid: resource.prlimit(node.slurmd_pid, resource.RLIMIT_CORE) for node in cluster.nodes}
    try:
        for pid, (_, hard) in limits.items():
            resource.prlimit(pid, resource.RLIMIT_CORE, (0, hard))
        with containers.oci_conf(cluster.conf, cluster.root / "runc"):
            job_id = submit(cluster, job)
            info = cluster.wait_state(job_id, DONE, timeout=120)
    finally:
        for pid, limit in limits.items():
            resource.prlimit(pid, resource.RLIMIT_CORE, limit)
    log = batch_log(job, job_id)
    print("".join(line + "\n" for line in log.splitlines() if line.startswith(("clusterddp:", "srun:", "slurmstepd:"))),
          end="")
    assert info["JobState"] == "FAILED", log
    cause = f"_read_config: unable to open: {missing}/config.json"  # slurmstepd's, in slurmd's log only
    assert (f"clusterddp: attempt 0: the launcher never started on 2 of 2 node(s): cdslurm1,cdslurm2: {cause} "
            "(slurmd's log on cdslurm1); srun exited ") in log, log
    assert re.search(r"clusterddp: attempt 1 ended with exit status \d+; not restarting: the launch failed on every "
                     r"node before any worker ran, the same way as attempt 0", log), log
    assert "clusterddp: attempt 2" not in log
    assert cluster.wait_clean(10) == {}
