"""Real SLURM, 2 nodes x 1 worker: the launchers of one srun step restart the job in place
(clusterddp/launch/restart/stepcoord.py), the verdict stops a failure that will repeat, and a lost
launcher falls back to the batch script's new step (docs/slurm.md, "Restarts in place")."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import cli_env
from tests.slurm.test_slurm_cluster import DONE, batch_log, submit, wait_for_file, write_job
from tests.testbed.slurm_cluster import SlurmCluster, slurm_cluster, unavailable_reason

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]

BIN = Path(__file__).parent / "bin"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    with slurm_cluster(2, base_env=cli_env()) as running:
        yield running


def events(job: Path, job_id: str, node: int) -> list[dict[str, object]]:
    lines = (job.parent / "logs" / job_id / f"events.node{node}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_killed_worker_restarts_in_place(cluster: SlurmCluster, tmp_path: Path) -> None:
    """restarts: 1, rank 1 SIGKILLed at step 20: attempt 1 runs under the same launchers (same pid,
    TORCHELASTIC_RESTART_COUNT=1), one srun step, the job COMPLETED, the events say so."""
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(tmp_path, "inplace", BIN / "kill_then_finish.py", [str(out)], restarts=1, nproc_per_node=1)
    job_id = submit(cluster, job)
    info = cluster.wait_state(job_id, DONE, timeout=180)
    log = batch_log(job, job_id)
    print("".join(line + "\n" for line in log.splitlines() if line.startswith("clusterddp:")), end="")
    assert info["JobState"] == "COMPLETED", log
    stamps = {p.name: p.read_text().split() for p in out.glob("rank*.attempt*")}
    assert sorted(stamps) == ["rank0.attempt0", "rank0.attempt1", "rank1.attempt0", "rank1.attempt1"], log
    for rank in (0, 1):
        first, second = stamps[f"rank{rank}.attempt0"], stamps[f"rank{rank}.attempt1"]
        assert (first[0], second[0]) == ("0", "1")
        assert first[1] == second[1], f"rank {rank}: launcher {first[1]} then {second[1]}"
    assert "restart 1 of 1" not in log  # no new srun step
    assert re.search(r"clusterddp: attempt 0 failed \(node 1 \(cdslurm2\) first: SIGKILL\); restarting in place: "
                     r"attempt 1 of 1, master port \d+\n", log), log
    assert re.search(r"clusterddp: final report: attempt 0-1 \(in place\) on 2 node\(s\) \S+: exit status 0 after",
                     log), log
    resumed = float((out / "resumed").read_text()) - float((out / "killed").read_text())
    kinds = [e["kind"] for e in events(job, job_id, 0)]
    assert kinds.count("restart") == 1 and kinds.count("attempt_start") == 2, kinds
    restart = next(e for e in events(job, job_id, 0) if e["kind"] == "restart")
    assert restart["in_place"] is True and restart["attempt"] == 0, restart
    assert cluster.wait_clean(15) == {}
    print(f"in place: kill to the next attempt's first step {resumed:.2f}s")


def test_an_import_error_at_step_0_is_not_restarted(cluster: SlurmCluster, tmp_path: Path) -> None:
    """restarts: 3, a ModuleNotFoundError on the script's second line: one srun step, no restart in place
    either, one line in the batch log saying why, the job FAILED."""
    script = tmp_path / "bad_import.py"
    script.write_text("import os\nimport clusterddp_no_such_module\n")
    job = write_job(tmp_path, "badimport", script, restarts=3, nproc_per_node=1)
    job_id = submit(cluster, job)
    info = cluster.wait_state(job_id, DONE, timeout=180)
    log = batch_log(job, job_id)
    print("".join(line + "\n" for line in log.splitlines() if line.startswith("clusterddp:")), end="")
    assert info["JobState"] == "FAILED", log
    why = [line for line in log.splitlines() if "not restarting" in line]
    assert len(why) == 1 and re.fullmatch(
        r"clusterddp: attempt 0 ended with exit status \d+; not restarting: ModuleNotFoundError at bad_import\.py:2 "
        r"before any progress: it will fail the same way again.*", why[0]), log
    assert "restart 1 of 3" not in log and "restarting in place" not in log, log
    report = re.findall(r"clusterddp: final report: (.*)", log)
    assert len(report) == 1 and report[0].startswith("attempt 0 on 2 node(s)"), log
    assert cluster.wait_clean(15) == {}


def launcher_pid(cluster: SlurmCluster, node: int, job: Path) -> int:
    """The launcher of ``job`` on ``node``: a child of slurmstepd (srun, on node 0 beside it, runs
    the same command line)."""
    def words(pid: int) -> list[str]:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return []

    def parent(pid: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    found = [pid for pid in cluster.node_processes(cluster.nodes[node]) if str(job) in words(pid)
             and "clusterddp" in words(pid) and words(parent(pid))[0].startswith("slurmstepd")]
    assert len(found) == 1, found
    return found[0]


def records(job: Path, job_id: str) -> Path:
    """The first step's record directory (the batch script's, shared by the launchers)."""
    return job.parent / "logs" / job_id / "launchers" / "0.0"


def test_scancel_while_a_launcher_waits_for_the_decision(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Rank 1 killed, rank 0 lingers through its grace period: scancel while node 2's launcher waits for
    node 1's decision ends the job CANCELLED with nothing left on either node."""
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(tmp_path, "waitcancel", BIN / "kill_then_finish.py", [str(out), "1", "1"], restarts=1,
                    nproc_per_node=1, grace_period=5)
    job_id = submit(cluster, job)
    wait_for_file(records(job, job_id) / "attempt0.node1.end", job, job_id)
    assert not (records(job, job_id) / "attempt0.decision").exists()
    cluster.command("scancel", job_id)
    info = cluster.wait_state(job_id, DONE, timeout=60)
    assert info["JobState"] == "CANCELLED", batch_log(job, job_id)
    assert not (out / "rank0.attempt1").exists()
    assert cluster.wait_clean(15) == {}


@pytest.mark.parametrize("waiting", [1, 0])
def test_a_launcher_killed_while_waiting_falls_back_to_a_new_step(cluster: SlurmCluster, tmp_path: Path,
                                                                  waiting: int) -> None:
    """The launcher of node ``waiting`` SIGKILLed while it waits (node 2 for the decision, node 1 for the
    other node's end): no restart in place; the batch script runs a new step, which COMPLETES."""
    out = tmp_path / "out"
    out.mkdir()
    killed_rank = waiting  # its worker dies first; the other lingers, so this node's launcher waits
    job = write_job(tmp_path, f"waitkill{waiting}", BIN / "kill_then_finish.py", [str(out), str(killed_rank), "1"],
                    restarts=1, nproc_per_node=1, grace_period=5)
    job_id = submit(cluster, job)
    wait_for_file(records(job, job_id) / f"attempt0.node{waiting}.end", job, job_id)
    pid = launcher_pid(cluster, waiting, job)
    os.kill(pid, signal.SIGKILL)
    info = cluster.wait_state(job_id, DONE, timeout=120)
    log = batch_log(job, job_id)
    print("".join(line + "\n" for line in log.splitlines() if line.startswith("clusterddp:")), end="")
    assert info["JobState"] == "COMPLETED", log
    assert not (records(job, job_id) / "attempt0.decision").exists() or waiting == 1, log
    assert re.search(r"clusterddp: attempt 0 ended with exit status \d+; left out: none; restart 1 of 1 in 1s on "
                     r"2 node\(s\): cdslurm1,cdslurm2\n", log), log
    stamps = {p.name: p.read_text().split() for p in out.glob("rank*.attempt*")}
    assert stamps["rank0.attempt1"][0] == "1" and stamps["rank0.attempt1"][1] != stamps["rank0.attempt0"][1]
    assert "restarting in place" not in log, log
    assert cluster.wait_clean(15) == {}


def test_a_race_on_one_rank_of_four_is_restarted_in_place(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Rank 1 lists a directory rank 0 has not made yet, in attempt 0 only; ranks 0, 2, 3 are
    healthy: node 0 judges from every node's ranks and restarts in place; the job completes."""
    script = tmp_path / "race.py"
    script.write_text("import os, time\nattempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
                      "if int(os.environ['RANK']) == 1 and attempt == 0:\n    os.listdir('/nonexistent-cddp/ck')\n"
                      "if attempt == 0:\n    time.sleep(300)\n")
    job = write_job(tmp_path, "race", script, restarts=2)
    job_id = submit(cluster, job)
    info = cluster.wait_state(job_id, DONE, timeout=240)
    log = batch_log(job, job_id)
    print("".join(line + "\n" for line in log.splitlines() if line.startswith("clusterddp:")), end="")
    assert info["JobState"] == "COMPLETED", log
    assert re.search(r"clusterddp: restarting: FileNotFoundError at race\.py:4 on rank 1 only; ranks 0,2,3 were "
                     r"healthy \(node 0, ", log), log
    assert "not restarting" not in log, log
    assert cluster.wait_clean(15) == {}
