"""``clusterddp status|logs|stop RUN`` for a run started here (issue 33, goal 4), by run id or
a prefix of it, with real launchers; hostile and ambiguous ids are one line and exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp.procid import ProcessIdentity, this_process
from clusterddp.registry import store
from tests.registry.helpers import clusterddp, records, start, wait_ready, waiting_job, write_job
from tests.testbed.patience import patient

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def worker_pids(run_dir: Path) -> list[int]:
    """The ranks' pids as ``/proc`` has them: processes whose cwd ... no: whose environment
    names this run (TORCHELASTIC_RUN_ID)."""
    found = []
    needle = f"TORCHELASTIC_RUN_ID={run_dir.name}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_stop_status_and_logs_of_a_running_local_run(tmp_path: Path) -> None:
    """A running run: status says running, logs shows each rank's lines, stop (by a prefix of
    the id) ends the launcher and every rank; the record then says stopped; a second stop says
    it already ended."""
    home = tmp_path / "home"
    job, ready, _ = waiting_job(tmp_path)
    launcher = start("run", str(job), home=home, cwd=tmp_path)
    wait_ready(ready, 2, launcher)
    [record] = records(home)
    run_id = record["run_id"]
    ranks = worker_pids(Path(record["run_dir"]))
    assert len(ranks) >= 2, ranks
    status = clusterddp("status", run_id, home=home, cwd=tmp_path)
    assert status.returncode == 0 and "state:       running" in status.stdout, status.stdout + status.stderr
    shown = clusterddp("logs", run_id, home=home, cwd=tmp_path)
    assert shown.returncode == 0
    assert sorted(shown.stdout.splitlines()) == ["[rank 0] rank 0 started", "[rank 1] rank 1 started"]
    one = clusterddp("logs", run_id, "--rank", "1", home=home, cwd=tmp_path)
    assert one.stdout == "rank 1 started\n", one.stdout + one.stderr
    stopped = clusterddp("stop", run_id[:-2], home=home, cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"run {run_id} stopped" in stopped.stdout
    assert launcher.poll() is not None and launcher.returncode == 128 + signal.SIGTERM
    launcher.communicate()
    assert all(_gone(pid) for pid in ranks), "a rank outlived stop"
    [after] = records(home)
    assert after["state"] == "stopped" and after["exit_code"] == 143 and after["stop_requested"]
    again = clusterddp("stop", run_id, home=home, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.strip() == (
        f"clusterddp: run {run_id} has already ended (stopped, exit code 143): nothing to stop")


def test_logs_follow_prints_to_the_end_of_the_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job, ready, go = waiting_job(tmp_path)
    launcher = start("run", str(job), home=home, cwd=tmp_path)
    wait_ready(ready, 2, launcher)
    run_id = records(home)[0]["run_id"]
    follower = start("logs", run_id, "-f", home=home, cwd=tmp_path)
    time.sleep(0.5)  # the follower is at the end of what exists (not a timing assert: order only)
    go.touch()
    out, err = follower.communicate(timeout=patient(120))
    assert follower.returncode == 0, err
    assert launcher.wait(timeout=60) == 0
    lines = out.splitlines()
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] rank {rank} started", f"[rank {rank}] rank {rank} done"], out


def test_stop_never_signals_a_stranger_with_the_recorded_pid(tmp_path: Path) -> None:
    """A record still saying running whose pid now names another process (another start
    time): stop sends nothing, says why, and the stranger lives on."""
    env = {"CLUSTERDDP_HOME": str(tmp_path / "home")}
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = this_process()
        launcher = ProcessIdentity(stranger.pid, 1, me.boot_id, me.host)
        store.save(store.RunRecord(run_id="old-run", target="local", job="j", run_dir=str(tmp_path),
                                   launcher={**launcher.as_record(), "host": me.host}, started=time.time()), env)
        result = clusterddp("stop", "old-run", home=tmp_path / "home", cwd=tmp_path)
        assert result.returncode == 0 and "has already ended (lost)" in result.stdout, result.stdout + result.stderr
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize("action", ["status", "stop", "logs"])
@pytest.mark.parametrize("run_id, said", [
    ("../x", "letters, digits"),
    ("$(touch pwned)", "letters, digits"),
    ("a\nb", "letters, digits"),
    ("a" * 5000, "at most 128 characters"),
    ("twin", "is the start of 2 runs"),
    ("nosuch", "no run 'nosuch'"),
])
def test_a_bad_run_id_is_one_line_and_exit_2(tmp_path: Path, action: str, run_id: str, said: str) -> None:
    env = {"CLUSTERDDP_HOME": str(tmp_path / "home")}
    for name in ("twin-1", "twin-2"):
        store.save(store.RunRecord(run_id=name, target="local", job="j", run_dir=str(tmp_path), state="finished"), env)
    result = clusterddp(action, run_id, home=tmp_path / "home", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr) < 1100
    assert not (tmp_path / "pwned").exists()


def test_status_slurm_and_a_scheduler_name_still_mean_the_scheduler(tmp_path: Path) -> None:
    """``clusterddp status k8s`` is the scheduler's action (its usage line), not a run id."""
    result = clusterddp("status", "k8s", home=tmp_path / "home", cwd=tmp_path)
    assert result.returncode == 2 and "no run" not in result.stderr, result.stderr


def test_a_run_id_of_another_target_without_the_action_is_one_line(tmp_path: Path) -> None:
    env = {"CLUSTERDDP_HOME": str(tmp_path / "home")}
    store.save(store.RunRecord(run_id="openpai-alice_x", target="openpai", job="j", run_dir="", job_id="alice~x",
                               state="pending", scheduler_options={"url": "http://127.0.0.1:9", "id_field": "job_id"}),
               env)
    result = clusterddp("logs", "openpai-alice_x", home=tmp_path / "home", cwd=tmp_path)
    assert result.returncode == 2 and "openpai supports" in result.stderr and len(result.stderr.splitlines()) == 1
