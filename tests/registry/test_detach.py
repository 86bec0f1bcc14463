"""``clusterddp run --detach`` and ``clusterddp attach`` for local runs (issue 33, goals 1 and 2,
local part): the run goes on in its own session after the command returns, ``attach`` prints
its console from the first line to the end and exits with the run's code. Real launchers."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.registry.helpers import clusterddp, records, start, waiting_job, write_job
from tests.testbed.patience import patient

pytestmark = pytest.mark.slow


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def test_detach_returns_with_every_rank_running_and_attach_prints_every_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job, ready, go = waiting_job(tmp_path)
    result = clusterddp("run", str(job), "--detach", home=home, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    assert f"clusterddp attach {run_id}" in result.stderr
    [record] = records(home)
    assert record["run_id"] == run_id and record["detached"] and record["state"] == "running"
    pid = record["launcher"]["pid"]
    fields = _stat(pid)
    assert int(fields[3]) == pid and int(fields[4]) == 0, "the launcher leads its own session, without a terminal"
    deadline = time.monotonic() + patient(60)  # the launcher is not our child: wait on its files
    while len(list(ready.glob("rank*.ready"))) < 2:
        assert time.monotonic() < deadline, "the ranks never became ready"
        time.sleep(0.05)
    listed = clusterddp("ls", home=home, cwd=tmp_path).stdout
    assert f"{run_id}  local" in listed and " running " in listed
    first = start("attach", run_id[:12], home=home, cwd=tmp_path)
    second = start("attach", run_id, home=home, cwd=tmp_path)  # two at once: each sees every line
    go.touch()
    for follower in (first, second):
        out, err = follower.communicate(timeout=patient(120))
        assert follower.returncode == 0, err
        for rank in (0, 1):  # every line of each rank's log, in its order (goal 2)
            label = f"[{socket.gethostname()} rank {rank}] "
            shown = [line[len(label):] for line in out.splitlines() if line.startswith(label)]
            logged = Path(record["run_dir"], f"rank{rank}.log").read_text().splitlines()
            assert shown == logged == [f"rank {rank} started", f"rank {rank} done"], out
    [after] = records(home)
    assert (after["state"], after["exit_code"]) == ("finished", 0)


def test_attach_exits_with_the_runs_code_also_long_after_it_ended(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, name="fails", args=["3", "1"])
    result = clusterddp("run", str(job), "--detach", home=home, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    follow = clusterddp("attach", run_id, home=home, cwd=tmp_path)
    assert follow.returncode == 3, follow.stdout + follow.stderr
    assert "rank 1 exiting with 3" in follow.stdout and "root cause" in follow.stdout
    again = clusterddp("attach", run_id, home=home, cwd=tmp_path)  # the run is over: whole console, its code
    assert again.returncode == 3 and again.stdout == follow.stdout


def test_ctrl_c_detaches_attach_and_the_run_goes_on(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job, ready, go = waiting_job(tmp_path)
    assert clusterddp("run", str(job), "--detach", home=home, cwd=tmp_path).returncode == 0
    [record] = records(home)
    deadline = time.monotonic() + patient(60)
    while len(list(ready.glob("rank*.ready"))) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    follower = start("attach", record["run_id"], home=home, cwd=tmp_path)
    assert follower.stdout is not None
    assert "started" in follower.stdout.readline()  # attach is following now
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0 and "detached from run" in err, err
    assert records(home)[0]["state"] == "running"
    os.kill(record["launcher"]["pid"], 0)  # still there
    go.touch()
    assert clusterddp("attach", record["run_id"], home=home, cwd=tmp_path).returncode == 0


def test_a_refused_detached_run_says_why_in_one_line_and_exits_2(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, name="missing", script="no_such_script.py")
    result = clusterddp("run", str(job), "--detach", home=home, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "no_such_script.py" in lines[0], result.stderr


def test_detach_in_the_job_file_and_its_refusals(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, name="keyed", detach=True)
    result = clusterddp("run", str(job), home=home, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().startswith("keyed-"), result.stderr
    run_id = result.stdout.strip()
    assert clusterddp("attach", run_id, home=home, cwd=tmp_path).returncode == 0
    ssh = write_job(tmp_path, name="overssh", detach=True, ssh={"hosts": ["node1"]})
    refused = clusterddp("run", str(ssh), home=home, cwd=tmp_path)
    # an SSH run detaches now (its head goes to the first host: tests/ssh/test_detach_ssh.py); a
    # host that cannot be reached is still one line, exit 2, and nothing recorded
    assert refused.returncode == 2 and "node1: cannot resolve node1" in refused.stderr, refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and "Traceback" not in refused.stderr
    bad = write_job(tmp_path, name="badkey", detach="later")
    wrong = clusterddp("run", str(bad), home=home, cwd=tmp_path)
    assert wrong.returncode == 2 and "detach" in wrong.stderr
    plain = write_job(tmp_path, name="plain")
    assert clusterddp("run", str(plain), home=home, cwd=tmp_path).returncode == 0
    plain_id = [r["run_id"] for r in records(home) if r["job"] == "plain"][0]
    not_detached = clusterddp("attach", plain_id, home=home, cwd=tmp_path)
    assert not_detached.returncode == 2 and "was not detached" in not_detached.stderr
