"""SLURM runs in the registry (issue 33, goals 3 and 4) on the real test bed: ``submit slurm``,
then ``ls`` (pending/running -> finished), ``logs`` (the batch log, one rank's), ``stop``
(scancel), a failed job's root cause, and the right final state for a job SLURM no longer
knows, with no slurmdbd (the test bed has AccountingStorageType=accounting_storage/none)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from clusterddp.registry import store
from tests.slurm.test_slurm_cluster import BIN, DONE, write_job
from tests.testbed.patience import patient
from tests.testbed.slurm_cluster import SlurmCluster, slurm_cluster, unavailable_reason
from tests.conftest import REPO, cli_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]

WAIT = REPO / "tests" / "bin" / "wait_for_file.py"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    with slurm_cluster(2, base_env=cli_env()) as running:
        yield running


def cddp(cluster: SlurmCluster, home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd,
                          env={**cluster.env, "CLUSTERDDP_HOME": str(home)}, capture_output=True, text=True,
                          timeout=300)


def ls(cluster: SlurmCluster, home: Path, cwd: Path, *flags: str) -> dict[str, dict[str, Any]]:
    done = cddp(cluster, home, cwd, "ls", "--json", *flags)
    assert done.returncode == 0, done.stderr
    return {run["run_id"]: run for run in json.loads(done.stdout)["runs"]}


def submitted(cluster: SlurmCluster, home: Path, job: Path) -> tuple[str, str]:
    done = cddp(cluster, home, job.parent, "submit", "slurm", str(job))
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    return job_id, f"slurm-{job_id}"


def wait_ready(ready: Path, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + patient(timeout)
    while len(list(ready.glob("rank*.ready"))) < count:
        assert time.monotonic() < deadline, "the ranks never became ready"
        time.sleep(0.1)


def test_submit_ls_logs_and_the_state_after_squeue_forgets(cluster: SlurmCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    job = write_job(tmp_path, "waiting", WAIT, args=[str(ready), str(go)])
    job_id, run_id = submitted(cluster, home, job)
    first = ls(cluster, home, tmp_path)[run_id]
    assert first["state"] in ("pending", "running") and first["job_id"] == job_id and first["target"] == "slurm"
    wait_ready(ready, 4)
    running = ls(cluster, home, tmp_path)[run_id]
    assert running["state"] == "running" and "cdslurm" in running["where"], running
    rank3 = cddp(cluster, home, tmp_path, "logs", run_id, "--rank", "3")
    assert rank3.returncode == 0 and rank3.stdout == "rank 3 started\n", rank3.stdout + rank3.stderr
    go.touch()
    follow = cddp(cluster, home, tmp_path, "logs", run_id, "-f")  # to the job's end
    assert follow.returncode == 0, follow.stderr
    assert all(f"rank {r} done" in follow.stdout for r in range(4)), follow.stdout
    info = cluster.wait_state(job_id, DONE, timeout=120)
    assert info["JobState"] == "COMPLETED"
    done = ls(cluster, home, tmp_path)[run_id]
    assert (done["state"], done["exit_code"], done["attempts"]) == ("finished", 0, 1), done
    status = cddp(cluster, home, tmp_path, "status", "slurm", job_id)
    assert status.returncode == 0 and "state:       finished" in status.stdout, status.stdout + status.stderr
    # A job squeue no longer lists (MinJobAge passed), no sacct: the batch script's record says
    # how it ended. The same files, under a job id this cluster never had.
    record = store.find(run_id, {"CLUSTERDDP_HOME": str(home)})
    forgotten = tmp_path / "logs" / "99999990"
    shutil.copytree(record.run_dir, forgotten)
    store.save(store.RunRecord(run_id="slurm-99999990", target="slurm", job="waiting", run_dir=str(forgotten),
                               job_id="99999990", state="running", started=time.time()),
               {"CLUSTERDDP_HOME": str(home)})
    later = ls(cluster, home, tmp_path)["slurm-99999990"]
    assert (later["state"], later["exit_code"]) == ("finished", 0), later
    assert cluster.wait_clean(15) == {}


def test_a_failed_job_has_its_root_cause_also_once_squeue_forgets_it(cluster: SlurmCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, "failing", BIN / "fail_on_last_node.py")
    job_id, run_id = submitted(cluster, home, job)
    assert cluster.wait_state(job_id, DONE, timeout=180)["JobState"] == "FAILED"
    failed = ls(cluster, home, tmp_path)[run_id]
    # The job's own status is srun's (143: --kill-on-bad-exit stopped the other ranks); the
    # root cause is the launchers' first failure.
    assert failed["state"] == "failed" and failed["exit_code"] not in (0, None), failed
    assert "rank 3" in failed["root_cause"] and "cdslurm2" in failed["root_cause"], failed
    record = store.find(run_id, {"CLUSTERDDP_HOME": str(home)})
    assert record.state == "failed", "ls wrote the final state into the record"
    forgotten = tmp_path / "logs" / "99999991"
    shutil.copytree(record.run_dir, forgotten)
    store.save(store.RunRecord(run_id="slurm-99999991", target="slurm", job="failing", run_dir=str(forgotten),
                               job_id="99999991", state="pending", started=time.time()),
               {"CLUSTERDDP_HOME": str(home)})
    later = ls(cluster, home, tmp_path)["slurm-99999991"]
    assert (later["state"], later["exit_code"], later["root_cause"]) == ("failed", failed["exit_code"],
                                                                         failed["root_cause"]), later
    assert cluster.wait_clean(15) == {}


def test_stop_a_running_job_by_run_id(cluster: SlurmCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    job = write_job(tmp_path, "stopped", WAIT, args=[str(ready), str(go)])
    job_id, run_id = submitted(cluster, home, job)
    wait_ready(ready, 4)
    stop = cddp(cluster, home, tmp_path, "stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"asked SLURM to cancel job {job_id}" in stop.stdout
    assert cluster.wait_state(job_id, DONE, timeout=120)["JobState"] == "CANCELLED"
    assert ls(cluster, home, tmp_path)[run_id]["state"] == "stopped"
    again = cddp(cluster, home, tmp_path, "stop", run_id)
    assert again.returncode == 0 and "has already ended (stopped)" in again.stdout, again.stdout + again.stderr
    assert not list(ready.parent.glob("go"))
    assert cluster.wait_clean(15) == {}
