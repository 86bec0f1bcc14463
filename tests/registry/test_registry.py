"""The run registry (issue 33, goal 5): every run typed here records itself, whole, in one
directory that ``CLUSTERDDP_HOME`` moves, safe with two commands at once, without a secret.

Real launchers (``clusterddp run``, gloo workers) write the records; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp.registry import store
from tests.registry.helpers import clusterddp, records, start, write_job

pytestmark = pytest.mark.slow


def test_a_local_run_records_itself(tmp_path: Path) -> None:
    """``clusterddp run`` leaves one record: its id (the log dir's name), target, host, launcher
    pid, exit code 0, finished."""
    home = tmp_path / "home"
    job = write_job(tmp_path)
    result = clusterddp("run", str(job), home=home, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [record] = records(home)
    assert record["state"] == "finished" and record["exit_code"] == 0 and record["target"] == "local"
    assert record["run_id"].startswith("job-")
    assert Path(record["run_dir"]) == tmp_path / "logs" / record["run_id"]
    assert (Path(record["run_dir"]) / "rank1.log").is_file()
    assert record["launcher"]["pid"] > 0 and record["launcher"]["start_time"] is not None
    assert record["attempts"] == 1 and record["ended"] >= record["started"]
    assert not list((home / "runs").glob(".*.tmp")), "a temporary file was left"


def test_a_failed_run_records_its_exit_code_and_root_cause(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, args=["3", "1"])
    result = clusterddp("run", str(job), home=home, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    [record] = records(home)
    assert record["state"] == "failed" and record["exit_code"] == 3
    assert "rank 1" in record["root_cause"] and "3" in record["root_cause"], record


def test_a_dry_run_and_a_node_placed_by_hand_record_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path)
    assert clusterddp("run", str(job), "--dry-run", home=home, cwd=tmp_path).returncode == 0
    assert records(home) == []


def test_clusterddp_home_moves_the_registry_and_xdg_state_home_is_the_default(tmp_path: Path) -> None:
    assert store.home({"CLUSTERDDP_HOME": "/x/y"}) == Path("/x/y")
    assert store.home({"XDG_STATE_HOME": "/s", "HOME": "/h"}) == Path("/s/clusterddp")
    assert store.home({"XDG_STATE_HOME": "relative"}).parts[-3:] == (".local", "state", "clusterddp")


def test_two_runs_at_once_each_record_whole(tmp_path: Path) -> None:
    """Two ``clusterddp run`` started together, and many updates of one record from two
    processes at once: every record is whole and every update lands (the lock)."""
    home = tmp_path / "home"
    jobs = [write_job(tmp_path, name=f"twin{i}") for i in range(2)]
    procs = [start("run", str(job), home=home, cwd=tmp_path) for job in jobs]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    assert sorted(r["job"] for r in records(home)) == ["twin0", "twin1"]
    assert all(r["state"] == "finished" for r in records(home))
    # Read-modify-write from two processes: each appends its own host 50 times.
    run_id = records(home)[0]["run_id"]
    code = ("import sys; from clusterddp.registry import store\n"
            "for i in range(50):\n"
            "    with store._Lock(store.runs_dir()):\n"
            "        r = store.find(sys.argv[1]); r.hosts.append(sys.argv[2] + str(i)); store.save(r)\n")
    env = {**os.environ, "CLUSTERDDP_HOME": str(home)}
    writers = [subprocess.Popen([sys.executable, "-c", code, run_id, who], env=env) for who in "ab"]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    [hosts] = [r["hosts"] for r in records(home) if r["run_id"] == run_id]
    assert len(hosts) == 101, hosts


@pytest.mark.parametrize("mode", ["record", "stream"])
def test_the_registry_never_holds_a_secret(tmp_path: Path, mode: str) -> None:
    """A worker that leaks its API key (env_passthrough) in its error file or its output and
    fails: the record says why it failed; no file of the registry holds the value."""
    home = tmp_path / "home"
    secret = "sk-registry-canary-5f2a9c"
    job = write_job(tmp_path, script="leak_secret.py", args=["CANARY_TOKEN", mode], nproc_per_node=1,
                    env_passthrough=["CANARY_TOKEN"])
    result = clusterddp("run", str(job), home=home, cwd=tmp_path, CANARY_TOKEN=secret)
    assert result.returncode == 1, result.stderr
    [record] = records(home)
    assert record["state"] == "failed" and "exit code 1" in record["root_cause"], record
    for path in (home / "runs").iterdir():
        assert secret not in path.read_text(errors="replace"), path


def test_a_secret_in_any_text_of_a_record_is_masked_when_written(tmp_path: Path) -> None:
    """Every text field passes redact's rules on its way to the file (a root cause quoting a
    registered value, a host list, a scheduler option)."""
    from clusterddp import redact

    secret = "hf_registry_canary_77c1"
    redact.register(secret)
    env = {"CLUSTERDDP_HOME": str(tmp_path)}
    record = store.RunRecord(run_id="r1", target="slurm", job="j", run_dir="/tmp/x",
                             root_cause=f"KeyError: {secret!r}", hosts=[f"n1-{secret}"],
                             scheduler_options={"url": f"https://x/?t={secret}"})
    store.save(record, env)
    text = (tmp_path / "runs" / "r1.json").read_text()
    assert secret not in text and text.count("***") == 3, text


def test_a_registry_that_cannot_be_written_costs_a_warning_not_the_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("a file where the directory should be")
    job = write_job(tmp_path)
    result = clusterddp("run", str(job), home=home, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "run registry" in line]
    assert len(warnings) == 1, result.stderr


@pytest.mark.parametrize("raw, why", [
    (b'{"run_id": "x"', "not JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1]", "not a JSON object"),
    (b'{"run_id": "x", "target": "mars", "job": "j", "run_dir": "/"}', "names no run"),
    (b'{"run_id": "x", "target": "local", "job": "j", "run_dir": "/", "exit_code": "0"}', "exit_code"),
])
def test_a_bad_record_is_skipped_with_one_line(tmp_path: Path, raw: bytes, why: str) -> None:
    env = {"CLUSTERDDP_HOME": str(tmp_path)}
    good = store.RunRecord(run_id="good", target="local", job="j", run_dir="/tmp/x", started=1.0)
    store.save(good, env)
    (tmp_path / "runs" / "x.json").write_bytes(raw)
    found, problems = store.load_all(env)
    assert [r.run_id for r in found] == ["good"]
    assert len(problems) == 1 and why in problems[0] and "x.json" in problems[0]
    json.dumps(problems)


def test_a_run_with_steps_records_its_goodput(tmp_path: Path) -> None:
    """clusterddp.train.fit reports steps: the record keeps ``clusterddp report``'s goodput (a
    script without step records has none: it shows '-', not 0%)."""
    home = tmp_path / "home"
    job = write_job(tmp_path, name="fit", script="fit_steps.py", args=["0.05", "2"],
                    env={"CKPT_DIR": str(tmp_path / "ckpt")})
    result = clusterddp("run", str(job), home=home, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    [record] = records(home)
    assert record["goodput"] is not None and 0 < record["goodput"] <= 1, record
    assert clusterddp("run", str(write_job(tmp_path, name="plain")), home=home, cwd=tmp_path).returncode == 0
    assert [r["goodput"] for r in records(home) if r["job"] == "plain"] == [None]
