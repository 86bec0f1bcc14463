"""``clusterddp ls`` (issue 33, goal 3): every recorded run with its state now, from real
launchers: finished, failed, running, lost (its launcher SIGKILLed), a bad record skipped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp.procid import this_process
from clusterddp.registry import store
from tests.registry.helpers import clusterddp, records, start, wait_ready, waiting_job, write_job

pytestmark = pytest.mark.slow


def ls_json(home: Path, cwd: Path) -> dict[str, dict[str, object]]:
    result = clusterddp("ls", "--json", home=home, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return {run["run_id"]: run for run in json.loads(result.stdout)["runs"]}


def test_ls_shows_finished_failed_running_and_lost_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert clusterddp("run", str(write_job(tmp_path, name="good")), home=home, cwd=tmp_path).returncode == 0
    assert clusterddp("run", str(write_job(tmp_path, name="bad", args=["3", "1"])), home=home,
                      cwd=tmp_path).returncode == 3
    job, ready, go = waiting_job(tmp_path, "going")
    going = start("run", str(job), home=home, cwd=tmp_path)
    lost_job, lost_ready, _ = waiting_job(tmp_path, "doomed")
    doomed = start("run", str(lost_job), home=home, cwd=tmp_path)
    try:
        wait_ready(ready, 2, going)
        wait_ready(lost_ready, 2, doomed)
        doomed.send_signal(signal.SIGKILL)  # the launcher dies without recording its end
        doomed.wait(timeout=30)
        runs = ls_json(home, tmp_path)
        by_job = {run["job"]: run for run in runs.values()}
        assert by_job["good"]["state"] == "finished" and by_job["good"]["exit_code"] == 0
        assert by_job["bad"]["state"] == "failed" and by_job["bad"]["exit_code"] == 3
        assert "rank 1" in str(by_job["bad"]["root_cause"])
        assert by_job["going"]["state"] == "running" and by_job["going"]["attempts"] == 1
        assert by_job["going"]["duration_s"] is not None and by_job["going"]["exit_code"] is None
        assert by_job["doomed"]["state"] == "lost", by_job["doomed"]
        assert "not running" in str(by_job["doomed"]["note"])
        table = clusterddp("ls", home=home, cwd=tmp_path)
        assert table.returncode == 0 and table.stderr == ""
        lines = table.stdout.splitlines()
        assert lines[0].split()[:4] == ["RUN", "ID", "TARGET", "WHERE"] and len(lines) == 5
        assert any(" lost " in line and "doomed-" in line for line in lines), table.stdout
    finally:
        go.touch()
        going.communicate(timeout=120)
    assert going.returncode == 0
    assert {run["job"]: run["state"] for run in ls_json(home, tmp_path).values()}["going"] == "finished"


def test_a_bad_record_is_one_line_and_ls_still_lists_the_others(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert clusterddp("run", str(write_job(tmp_path)), home=home, cwd=tmp_path).returncode == 0
    (home / "runs" / "torn.json").write_text('{"run_id": "torn", "tar')
    (home / "runs" / "fifo.json").unlink(missing_ok=True)
    os.mkfifo(home / "runs" / "fifo.json")  # a reader that opened it would hang
    result = clusterddp("ls", home=home, cwd=tmp_path, timeout=60)
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) == 2, result.stdout
    warnings = result.stderr.splitlines()
    assert len(warnings) == 2 and all(line.startswith("clusterddp: warning: ") for line in warnings), warnings
    assert any("torn.json" in line and "not JSON" in line for line in warnings)


def test_a_recorded_pid_that_is_now_another_process_is_lost_and_another_hosts_is_not_judged(tmp_path: Path) -> None:
    """procid's proof: a live pid with another start time is not the launcher (lost); a
    record from another host cannot be checked here and keeps its state, said in its note."""
    env = {"CLUSTERDDP_HOME": str(tmp_path / "home")}
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = this_process()
        reused = {"pid": stranger.pid, "start_time": 1, "boot_id": me.boot_id, "host": me.host}
        elsewhere = {**me.as_record(), "host": "gone-host.example"}
        for run_id, launcher in (("reused", reused), ("elsewhere", elsewhere)):
            store.save(store.RunRecord(run_id=run_id, target="local", job="j", run_dir=str(tmp_path / run_id),
                                       launcher=launcher, started=time.time()), env)
        runs = ls_json(tmp_path / "home", tmp_path)
        assert runs["reused"]["state"] == "lost" and "another process" in str(runs["reused"]["note"])
        assert runs["elsewhere"]["state"] == "running" and "gone-host.example" in str(runs["elsewhere"]["note"])
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_ls_with_no_registry_prints_the_header_only(tmp_path: Path) -> None:
    result = clusterddp("ls", home=tmp_path / "none", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("RUN ID") and len(result.stdout.splitlines()) == 1
    assert records(tmp_path / "none") == []
