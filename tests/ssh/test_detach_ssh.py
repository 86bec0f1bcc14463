"""``clusterddp run --hostfile H --detach`` on the real SSH test bed (issue 33, goal 1 for SSH):
the head goes to the first host of the hostfile (``launch.remotehead``), this machine keeps a
record of where; ``ls``, ``status``, ``attach``, ``logs`` and ``stop`` ask that host.

The test bed's "typing machine" is the root namespace (10.78.0.1 on the bridge every host hangs
off); hosts talk to each other over the bridge without it. Taking that address off the bridge
cuts the typing side off from every host while the hosts still reach each other: the cut the
issue's acceptance asks for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.ssh.conftest import REPO, write_job
from tests.testbed import SSHLab, namespaces
from tests.testbed.netns import BRIDGE, BRIDGE_IP
from tests.testbed.patience import patient

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _env(home: Path) -> dict[str, str]:
    """The test's registry here, and the detached head's on its host beside it (else the head
    would record into root's own registry on the shared filesystem)."""
    return {**os.environ, "CLUSTERDDP_HOME": str(home), "CLUSTERDDP_HEAD_HOME": str(home.parent / "head-home")}


def cddp(home: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``clusterddp ARGS`` on the typing side, with the test's registry."""
    env = _env(home)
    env.pop("CLUSTERDDP_HOSTFILE", None)
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=patient(timeout), stdin=subprocess.DEVNULL)


def started(home: Path, cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = _env(home)
    return subprocess.Popen([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def runs(home: Path, cwd: Path, *flags: str) -> list[dict[str, Any]]:
    listed = cddp(home, cwd, "ls", "--json", *flags)
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["runs"])


def detach(home: Path, cwd: Path, job: Path, lab: SSHLab, *extra: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    done = cddp(home, cwd, "run", str(job), "--hostfile", str(lab.hostfile), "--detach", *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1], done


def head_record(home: Path, run_id: str) -> dict[str, Any]:
    return dict(json.loads((home / "runs" / f"{run_id}.json").read_text()))


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + patient(timeout)
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout}s for {what}"
        time.sleep(0.1)


def test_a_detached_head_lives_on_the_first_host_and_stop_ends_every_rank(lab2: SSHLab, tmp_path: Path) -> None:
    """run --detach returns with every rank running and the head on cdssh1 (not here); ls and
    status say running over SSH; stop RUN ends every rank on every host; ls says stopped."""
    home = tmp_path / "home"
    job = write_job(lab2, "wait_forever.py", name="waits")
    run_id, done = detach(home, tmp_path, job, lab2)
    assert "its head runs on cdssh1" in done.stderr, done.stderr
    record = head_record(home, run_id)
    head_pid = record["head"]["pid"]["pid"]
    assert head_pid in lab2.processes(lab2.host("cdssh1")), "the head does not run on cdssh1"
    console = Path(record["console"])
    ready = [line for line in console.read_text().splitlines() if "ready rank" in line]
    [row] = runs(home, tmp_path)
    assert (row["state"], row["target"], row["detached"]) == ("running", "ssh", True), row
    status = cddp(home, tmp_path, "status", run_id)
    assert "state:       running" in status.stdout, status.stdout + status.stderr
    follower = started(home, tmp_path, "attach", run_id)  # Ctrl-C leaves the run going
    assert follower.stdout is not None
    seen = [follower.stdout.readline() for _ in range(2)]
    assert seen[0].startswith("clusterddp: 2 hosts") and "preflight passed" in seen[1], seen
    while sum("ready rank" in line for line in seen) < 4:  # every rank's first line, relayed from cdssh1
        seen.append(follower.stdout.readline())
        assert seen[-1], seen
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=patient(30))
    assert follower.returncode == 0 and f"detached from run {run_id}; it goes on" in err, err
    logs = cddp(home, tmp_path, "logs", run_id, "--rank", "3")
    assert logs.returncode == 0 and "ready rank 3 on cdssh2" in logs.stdout, logs.stdout + logs.stderr
    [again] = runs(home, tmp_path)
    assert again["state"] == "running", again
    stop = cddp(home, tmp_path, "stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    clean, _, left = lab2.wait_clean(15)
    assert clean, left
    [after] = runs(home, tmp_path)
    assert (after["state"], after["exit_code"]) == ("stopped", 143), after
    print(f"ranks ready when run --detach returned: {len(ready)} of 4")


def test_a_detached_head_sigkilled_is_lost_and_its_ranks_end(lab2: SSHLab, tmp_path: Path) -> None:
    """The detached head SIGKILLed on cdssh1: ls says lost (judged on that host), every rank on
    every host ends within the launchers' keepalive timeout, nothing is left anywhere."""
    home = tmp_path / "home"
    job = write_job(lab2, "wait_forever.py", name="waits")
    run_id, _ = detach(home, tmp_path, job, lab2)
    head_pid = head_record(home, run_id)["head"]["pid"]["pid"]
    os.kill(head_pid, signal.SIGKILL)
    killed = time.monotonic()
    clean, seconds, left = lab2.wait_clean(20)
    assert clean, left
    [row] = runs(home, tmp_path)
    assert row["state"] == "lost", row
    assert "launcher is gone" in (row["note"] or ""), row
    print(f"head SIGKILLed -> every host clean in {time.monotonic() - killed:.1f}s (wait_clean {seconds:.1f}s)")


def test_a_refused_detached_run_prints_the_heads_line_and_its_code(lab2: SSHLab, tmp_path: Path) -> None:
    """The master port busy on cdssh1: the head's preflight there refuses the run; run --detach
    prints the head's own lines and exits with its code (2); ls records it failed; nothing of
    the run is left. (A refusal this machine can see, a missing script, stays one line here.)"""
    home = tmp_path / "home"
    job = write_job(lab2, "wait_forever.py", name="busy")
    port = "29531"
    holder = subprocess.Popen(["nsenter", f"--net={lab2.host('cdssh1').netns_path}", sys.executable, "-c",
                               f"import socket, time; s = socket.socket(); s.bind(('0.0.0.0', {port})); "
                               "s.listen(); print('bound', flush=True); time.sleep(300)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "bound"
        done = cddp(home, tmp_path, "run", str(job), "--hostfile", str(lab2.hostfile), "--detach",
                    "--master-port", port)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "preflight failed" in done.stderr and "master port not free" in done.stderr, done.stderr
    assert done.stdout == "", done.stdout
    [row] = runs(home, tmp_path)
    assert (row["state"], row["exit_code"]) == ("failed", 2), row
    clean, _, left = lab2.wait_clean(10)
    assert clean, left
    missing = write_job(lab2, str(tmp_path / "missing.py"), name="missing")
    local = cddp(home, tmp_path, "run", str(missing), "--hostfile", str(lab2.hostfile), "--detach")
    assert local.returncode == 2 and local.stderr.count("\n") == 1 and "no such file" in local.stderr, local.stderr


#: The typing side stays cut off at least this long: past the launchers' keepalive timeout and
#: sshd's ClientAlive (15 s), so a head that still needed this machine would have failed.
CUT_AT_LEAST = 20.0


def _typing_side(home: Path) -> list[int]:
    """This machine's clusterddp processes of the test's registry (the root namespace: the
    hosts' namespaces are the cluster)."""
    mine = os.readlink("/proc/self/ns/net")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != mine or int(pid) == os.getpid():
                continue
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"clusterddp" in command and f"CLUSTERDDP_HOME={home}".encode() in environ:
            found.append(int(pid))
    return found


def test_acceptance_the_run_outlives_the_typing_side_and_a_dead_host(lab3: SSHLab, tmp_path: Path) -> None:
    """Issue 33's SSH acceptance: a 3-host job (nodes 2:3, restarts 2, a gloo step loop that
    checkpoints every step, tests/bin/transient_fault.py) started with run --detach; then every
    clusterddp process of the typing side SIGKILLed (an attach following it) and the typing side
    cut off from every host (its address taken off the bridge: the hosts still reach each
    other); cdssh3 killed mid-run (its link cut, every process in it SIGKILLed). The head on
    cdssh1 restarts the job on cdssh1+2 from the checkpoint and it finishes while the typing
    side is still cut off. With the link back: ls says finished, exit 0, 2 attempts; attach
    prints the whole console (every line of every rank's log, in order); nothing is left."""
    home = tmp_path / "home"
    job = write_job(lab3, str(REPO / "tests" / "bin" / "transient_fault.py"), nproc=1, name="accept",
                    args=["link", str(tmp_path)], env={"OMP_NUM_THREADS": "1"})
    data = yaml.safe_load(job.read_text())
    data.update({"nodes": "2:3", "restarts": 2, "python": sys.executable})
    job.write_text(yaml.safe_dump(data))
    run_id, _ = detach(home, tmp_path, job, lab3)
    run_dir = tmp_path / "logs" / run_id
    follower = started(home, tmp_path, "attach", run_id)
    wait_until(lambda: follower.pid in _typing_side(home), 30, "the attach to start")
    typing = _typing_side(home)
    for pid in typing:
        os.kill(pid, signal.SIGKILL)
    follower.wait()
    namespaces.ip("addr", "del", f"{BRIDGE_IP}/24", "dev", BRIDGE)
    cut = time.monotonic()
    try:
        wait_until(lambda: (tmp_path / "fault.pid").exists(), 120, "rank 2 (cdssh3) to reach step 2")
        dead = lab3.host("cdssh3")  # before the others' 60 s all_reduce timeout
        lab3.cut(dead)
        for pid in lab3.processes(dead, include_sshd=True):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        asked = time.monotonic()
        [unreachable] = runs(home, tmp_path)
        asked = time.monotonic() - asked
        assert unreachable["state"] == "running" and "not checked" in unreachable["note"], unreachable
        head_record_there = home.parent / "head-home" / "runs" / f"{run_id}.json"
        wait_until(lambda: json.loads(head_record_there.read_text()).get("state") != "running", 180,
                   "the head on cdssh1 to end the run")
        finished_cut = time.monotonic() - cut
        time.sleep(max(0.0, CUT_AT_LEAST - finished_cut))
        assert not _typing_side(home)
    finally:
        namespaces.ip("addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
    cut_for = time.monotonic() - cut
    [row] = runs(home, tmp_path)
    assert (row["state"], row["exit_code"], row["attempts"]) == ("finished", 0, 2), row
    attach = cddp(home, tmp_path, "attach", run_id)
    assert attach.returncode == 0, attach.stdout + attach.stderr
    printed = attach.stdout.splitlines()
    assert printed == Path(row["run_dir"], "console.log").read_text().splitlines()
    for rank in (0, 1):
        assert f"rank {rank} finished at step 4 (attempt 1, resumed at 2)" in attach.stdout, attach.stdout
    for log in sorted(run_dir.glob("rank[01].log")):  # cdssh3's rank 2 log ends with its host
        lines = [line for line in log.read_text().splitlines() if line and not line.startswith("--- clusterddp: restart")]
        shown = iter(printed)
        assert all(any(p.endswith(line) for p in shown) for line in lines), (log.name, lines, printed)
    console = attach.stdout + attach.stderr
    assert re.search(r"attempt 1: 3 host\(s\) \(world size 3\) .*cdssh3.*: exit", console), console
    assert re.search(r"attempt 2: 2 host\(s\) \(world size 2\) cdssh1,cdssh2: finished", console), console
    live = [h for h in lab3.hosts if h.name != "cdssh3"]
    deadline = time.monotonic() + patient(20)
    while any(lab3.processes(h) for h in live) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(lab3.processes(h) for h in live), {h.name: lab3.processes(h) for h in live}
    assert not lab3.processes(lab3.host("cdssh3"), include_sshd=True)
    print(f"typing side: {len(typing)} clusterddp process(es) SIGKILLed, cut off for {cut_for:.1f}s; "
          f"the run ended {finished_cut:.1f}s into the cut: {row['state']}, exit {row['exit_code']}, "
          f"{row['attempts']} attempts; attach printed {len(printed)} lines; ls while cut off: {asked:.1f}s, "
          f"{unreachable['note']}")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, mounted before the lab starts (each host's sshd copies this mount table
    then, so the hosts share it, as an NFS log directory), unmounted afterwards."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_detached_head_on_a_full_disk_runs_the_job_to_its_end(tiny_disk: Path, lab2: SSHLab,
                                                                tmp_path: Path) -> None:
    """The run's logs (the head's console and registry on cdssh1, every rank's log) on a 1 MiB
    disk that each rank fills (2 MiB each, tests/bin/flood.py), rank 1 then failing with exit
    3: the detached head runs the job to its end (its console, on that disk, losing what does not
    fit) and its end is known here (its registry is its host's, off the log disk): ls says
    failed, exit 3; attach exits 3; nothing is left on any host."""
    home = tmp_path / "home"
    job = write_job(lab2, str(REPO / "tests" / "bin" / "flood.py"), nproc=1, name="fill", args=["2", "1"])
    data = yaml.safe_load(job.read_text())
    data["logs"] = {"dir": str(tiny_disk)}
    job.write_text(yaml.safe_dump(data))
    done = cddp(home, tmp_path, "run", str(job), "--hostfile", str(lab2.hostfile), "--detach")
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 3: it ended before every rank was counted
    run_id = json.loads(next((home / "runs").glob("*.json")).read_text())["run_id"]
    wait_until(lambda: runs(home, tmp_path)[0]["state"] not in ("running", "pending"), 120, "the run's end")
    [row] = runs(home, tmp_path)
    assert (row["state"], row["exit_code"]) == ("failed", 3), row
    attach = cddp(home, tmp_path, "attach", run_id)
    assert attach.returncode == 3, attach.stdout[-2000:] + attach.stderr[-2000:]
    free = os.statvfs(tiny_disk)
    assert free.f_bavail * free.f_frsize < 64 * 1024, "the disk never filled up"
    clean, _, left = lab2.wait_clean(15)
    assert clean, left
