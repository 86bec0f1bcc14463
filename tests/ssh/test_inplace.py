"""Whole-job restarts in place over SSH (launch/ssh/inplace.py), on real sshd hosts: the next
attempt runs on the launchers (and their zygotes) that waited for it; where it cannot (a host's
launcher gone) the head probes and launches anew; nothing is left running in any path."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.conftest import cli, cli_env
from tests.ssh.conftest import BIN, REPO, Head, launcher_pid
from tests.testbed import SSHLab
from tests.testbed.patience import patient

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _job(lab: SSHLab, script: Path, args: list[str], restarts: int) -> Path:
    data = {"name": "ip", "script": str(script), "args": args, "nproc_per_node": 1, "grace_period": 2,
            "restarts": restarts, "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"},
            "ssh": {"config_file": str(lab.ssh_config), "connect_timeout": 3}}
    path = lab.root / "ip.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _records(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """(rank, attempt) -> what the worker wrote about itself."""
    found = {}
    for path in out.glob("rank*.attempt*.json"):
        rank, attempt = re.findall(r"\d+", path.name)
        found[int(rank), int(attempt)] = json.loads(path.read_text())
    return found


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_stderr(head: Head, pattern: str, timeout: float = 90.0) -> float:
    regex = re.compile(pattern)
    deadline = time.monotonic() + patient(timeout)
    while not any(regex.search(line) for line in list(head.stderr)):
        assert head.proc.poll() is None and time.monotonic() < deadline, f"no {pattern!r}:\n{head.output()}"
        time.sleep(0.02)
    return time.monotonic()


def test_a_killed_rank_restarts_in_place_on_the_same_launchers(lab2: SSHLab, head_factory: Callable[..., Head],
                                                               tmp_path: Path) -> None:
    """Rank 1 SIGKILLed at step 5 of a gloo job (restarts: 1): attempt 1 runs on the same launcher on
    each host (the workers' parent), forked from the same zygote, with TORCHELASTIC_RESTART_COUNT=1
    and a new MASTER_PORT, and completes; events, log markers and the report are those of a restart."""
    out = tmp_path / "out"
    out.mkdir()
    job = _job(lab2, BIN / "inplace_steps.py", [str(out)], restarts=1)
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile), "--run-id", "ip")
    code = head.finish(120)
    stderr = "\n".join(head.stderr)
    assert code == 0, head.output()
    assert "restarting the whole job in 0s (restart 1 of 1)" in stderr, stderr
    assert "restart 1: 2 host(s) cdssh1,cdssh2 (world size 2); in place (the same launchers)" in stderr, stderr
    records = _records(out)
    assert set(records) == {(0, 0), (1, 0), (0, 1), (1, 1)}, records
    for rank in (0, 1):
        before, after = records[rank, 0], records[rank, 1]
        assert before["ppid"] == after["ppid"], (before, after)  # the same launcher
        assert before["pid"] != after["pid"]
        assert any(part.endswith("zygote.py") for part in after["cmdline"]), after  # forked warm
        assert (before["restart"], after["restart"]) == ("0", "1")
        assert before["port"] != after["port"]
    assert "rank 0 attempt 1 done" in "\n".join(head.stdout) and "rank 1 attempt 1 done" in "\n".join(head.stdout)
    run_dir = tmp_path / "logs" / "ip"
    kinds = [e["kind"] for e in _events(run_dir / "events.jsonl")]
    assert kinds == ["run_start", "attempt_start", "attempt_end", "restart", "attempt_start", "attempt_end",
                     "run_end"], kinds
    for node in (0, 1):
        events = _events(run_dir / f"events.node{node}.jsonl")
        assert [e["kind"] for e in events].count("run_start") == 1, events  # one launcher for both attempts
        assert [e["attempt"] for e in events if e["kind"] == "attempt_start"] == [0, 1], events
        restart = [e for e in events if e["kind"] == "restart"]
        assert len(restart) == 1 and restart[0]["in_place"] is True, events
        assert str(restart[0]["master_port"]) == records[node, 1]["port"], (restart, records)
    for host in ("cdssh1", "cdssh2"):
        assert (run_dir / f"ssh-{host}.log").read_text().count("--- clusterddp: restart 1 ") == 1
    for rank in (0, 1):
        assert (run_dir / f"rank{rank}.log").read_text().count("--- clusterddp: restart 1 ") == 1
    done = cli("report", "ip", "--log-dir", str(tmp_path / "logs"), cwd=tmp_path, env=cli_env())
    assert done.returncode == 0, done.stderr
    for host in ("cdssh1", "cdssh2"):
        assert re.search(rf"{host}\s+attempt 1\s+first_step", done.stdout), done.stdout
    assert lab2.wait_clean(5)[0]


@pytest.mark.parametrize("dead, mode", [("cdssh3", "mark-last"), ("cdssh1", "mark-first")])
def test_a_lost_host_restarts_in_place_on_the_hosts_left(lab3: SSHLab, head_factory: Callable[..., Head],
                                                          tmp_path: Path, dead: str, mode: str) -> None:
    """nodes 2:3 on 3 listed hosts: one host dies at step 5 (link cut, every process in it killed),
    the last or node 0 (the master). No other host could join, so attempt 1 runs in place on the
    other two: the same launchers (the workers' parent) and zygotes, world size 2, node ranks 0
    and 1 in hostfile order (the master moved to the next host when node 0 went); the job
    completes and nothing is left running on the live hosts."""
    out = tmp_path / "out"
    out.mkdir()
    job = _job(lab3, BIN / "inplace_steps.py", [str(out), mode], restarts=1)
    data = yaml.safe_load(job.read_text())
    data["nodes"] = "2:3"
    job.write_text(yaml.safe_dump(data))
    head = head_factory(str(job), "--hostfile", str(lab3.hostfile), "--run-id", "shrink")
    deadline = time.monotonic() + 90
    while not (out / "mark").exists():
        assert head.proc.poll() is None and time.monotonic() < deadline, head.output()
        time.sleep(0.02)
    lost = lab3.host(dead)
    lab3.cut(lost)
    for pid in lab3.processes(lost, include_sshd=True):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    died = time.monotonic()
    code = head.finish(120)
    stderr = "\n".join(head.stderr)
    assert code == 0, head.output()
    assert re.search(rf"attempt 1 failed \({dead}: connection lost", stderr), stderr
    live = [h for h in lab3.hosts if h.name != dead]
    moved = f", master {live[0].ip}" if dead == "cdssh1" else ""
    assert (f"restart 1: 2 host(s) {live[0].name},{live[1].name} (world size 2); not used: {dead}: connection lost "
            f"in attempt 1; in place (the same launchers, numbered again{moved})") in stderr, stderr
    records = _records(out)
    old_ranks = [int(h.name[-1]) - 1 for h in live]  # each live host's rank in attempt 0
    assert {(0, 1), (1, 1)} <= set(records) and (2, 1) not in records, records
    for new_rank, old_rank in enumerate(old_ranks):
        before, after = records[old_rank, 0], records[new_rank, 1]
        assert before["ppid"] == after["ppid"], (before, after)  # the same launcher
        assert any(part.endswith("zygote.py") for part in after["cmdline"]), after
        assert (after["world"], after["group_rank"], after["restart"]) == ("2", str(new_rank), "1"), after
        assert (before["world"], after["master"]) == ("3", live[0].ip), (before, after)
    run_dir = tmp_path / "logs" / "shrink"
    for new_rank, old_rank in enumerate(old_ranks):  # each launcher's log keeps its first name
        restart = [e for e in _events(run_dir / f"events.node{old_rank}.jsonl") if e["kind"] == "restart"]
        assert len(restart) == 1 and restart[0]["in_place"] is True, restart
        assert (restart[0]["node_rank"], restart[0]["world_size"]) == (new_rank, 2), restart
    deadline = time.monotonic() + 10
    while any(lab3.processes(h) for h in live) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(lab3.processes(h) for h in live), {h.name: lab3.processes(h) for h in live}
    print(f"lost host {dead}: death -> job done {time.monotonic() - died:.1f}s")


def test_a_lost_launcher_falls_back_to_a_new_launch(lab2: SSHLab, head_factory: Callable[..., Head],
                                                    tmp_path: Path) -> None:
    """cdssh2's launcher is SIGKILLed in attempt 0: cdssh1's waits, but the next attempt cannot run in
    place; the waiting launcher is released, both hosts are probed and get new launchers, the job
    completes, and nothing is left running."""
    out = tmp_path / "out"
    out.mkdir()
    job = _job(lab2, BIN / "inplace_steps.py", [str(out), "kill-launcher"], restarts=1)
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile), "--run-id", "lost")
    code = head.finish(120)
    stderr = "\n".join(head.stderr)
    assert code == 0, head.output()
    assert re.search(r"^clusterddp: restart 1: 2 host\(s\) cdssh1,cdssh2 \(world size 2\)$", stderr, re.M), stderr
    assert "in place" not in stderr, stderr
    records = _records(out)
    for rank in (0, 1):
        assert records[rank, 0]["ppid"] != records[rank, 1]["ppid"], records  # new launchers
        assert records[rank, 1]["restart"] == "1"
    run_dir = tmp_path / "logs" / "lost"
    for node in (0, 1):
        events = _events(run_dir / f"events.node{node}.jsonl")
        assert [e["kind"] for e in events].count("run_start") == 2, events  # a launcher per attempt
    assert lab2.wait_clean(5)[0]


def _failing_job(lab: SSHLab, restarts: int = 3) -> Path:
    """Exit 3 at once, every attempt: restarts after 0 s, 1 s, 2 s, the hosts waiting meanwhile."""
    return _job(lab, REPO / "tests" / "bin" / "exit_with.py", ["3"], restarts=restarts)


def test_head_killed_while_hosts_wait_leaves_nothing(lab2: SSHLab, head_factory: Callable[..., Head]) -> None:
    """kill -9 of the head during a 2 s backoff, both launchers waiting for its word: they see EOF
    and end; nothing is left on either host."""
    head = head_factory(str(_failing_job(lab2)), "--hostfile", str(lab2.hostfile))
    _wait_stderr(head, r"restarting the whole job in 2s \(restart 3 of 3\)")
    assert all(lab2.processes(h) for h in lab2.hosts), "the launchers should be waiting"
    head.kill()
    clean, seconds, left = lab2.wait_clean(10)
    assert clean, left
    print(f"head killed while hosts wait: clean after {seconds:.1f}s")


def test_launcher_killed_while_waiting_is_replaced(lab2: SSHLab, head_factory: Callable[..., Head]) -> None:
    """cdssh2's launcher SIGKILLed while it waits out the 2 s backoff: the head sees its session end,
    releases cdssh1's, and starts the last attempt anew on both hosts; the job ends with the
    failure's exit after 4 attempts, nothing left running."""
    head = head_factory(str(_failing_job(lab2)), "--hostfile", str(lab2.hostfile))
    _wait_stderr(head, r"restarting the whole job in 2s \(restart 3 of 3\)")
    os.kill(launcher_pid(lab2, "cdssh2"), signal.SIGKILL)
    code = head.finish(60)
    stderr = "\n".join(head.stderr)
    assert code == 3, head.output()
    assert "restart 1: 2 host(s) cdssh1,cdssh2 (world size 2); in place" in stderr, stderr
    assert "restart 2: 2 host(s) cdssh1,cdssh2 (world size 2); in place" in stderr, stderr
    assert re.search(r"^clusterddp: restart 3: 2 host\(s\) cdssh1,cdssh2 \(world size 2\)$", stderr, re.M), stderr
    assert "4 attempts:" in stderr, stderr
    assert lab2.wait_clean(5)[0]


def test_link_cut_while_waiting_stops_everything(lab2: SSHLab, head_factory: Callable[..., Head]) -> None:
    """cdssh2's link is cut while both launchers wait out the 2 s backoff: the head finds the host
    lost and ends the job, and every host is clean soon after (the cut one stops for the silent
    keepalive). Found during the backoff (the usual case: ``ssh.link_timeout`` 1 s against what
    is left of 2 s), the check before the restart word releases the launchers, the next attempt
    is probed anew and the cut host fails the probe: 3 attempts. Found after the restart word
    went out, attempt 4 fails with the host lost: 4 attempts."""
    head = head_factory(str(_failing_job(lab2)), "--hostfile", str(lab2.hostfile))
    _wait_stderr(head, r"restarting the whole job in 2s \(restart 3 of 3\)")
    lab2.cut(lab2.host("cdssh2"))
    code = head.finish(60)
    stderr = "\n".join(head.stderr)
    assert code in (3, 255), head.output()
    during_backoff = re.search(r"^clusterddp: restart 3: preflight failed on 1 of 2 hosts", stderr, re.M)
    assert ("3 attempts:" in stderr) if during_backoff else ("4 attempts:" in stderr), head.output()
    print(f"link cut during the backoff: found {'before' if during_backoff else 'after'} the restart word")
    clean, seconds, left = lab2.wait_clean(6.0 + 2 + 2)  # the cut launcher stops within its keepalive timeout
    assert clean, left


def test_a_stop_signal_while_the_attempt_ends_stops_every_host(lab2: SSHLab, head_factory: Callable[..., Head],
                                                               tmp_path: Path) -> None:
    """Rank 1 fails, cdssh2's launcher waits, cdssh1's rank 0 ignores the SIGTERM that ends the attempt:
    SIGINT on the head meanwhile closes every stdin, the waiting launcher's too. No restart, the
    failure's exit, nothing left on either host."""
    out = tmp_path / "out"
    out.mkdir()
    job = _job(lab2, BIN / "term_ignored.py", [str(out)], restarts=2)
    data = yaml.safe_load(job.read_text())
    data["grace_period"] = 4  # rank 0 outlives the end of the attempt until the head's signal
    job.write_text(yaml.safe_dump(data))
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile))
    head.wait_for("rank 0 ignores SIGTERM")
    deadline = time.monotonic() + patient(30)
    while not list((tmp_path / "logs").glob("*/events.node1.jsonl")) or '"attempt_end"' not in \
            list((tmp_path / "logs").glob("*/events.node1.jsonl"))[0].read_text():
        assert time.monotonic() < deadline and head.proc.poll() is None, head.output()
        time.sleep(0.05)
    time.sleep(0.3)
    assert head.proc.poll() is None
    head.signal(signal.SIGINT)
    code = head.finish(30)
    stderr = "\n".join(head.stderr)
    assert code == 3, head.output()
    assert "restart 1:" not in stderr and "restarting the whole job" not in stderr, stderr
    clean, seconds, left = lab2.wait_clean(5)
    assert clean, left
