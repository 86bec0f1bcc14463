"""Whole-job restarts across real sshd hosts: a dead node costs a restart from the last
checkpoint, not the job (docs/ssh.md, "Fault tolerance").

The training runs are the example ``jobs/cifar10.py`` (clusterddp.train: checkpoint per epoch,
``resume="auto"``) on its generated stand-in data, one gloo worker per host.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.ssh.conftest import REPO, launcher_pid as _launcher_pid, write_job
from tests.testbed import SSHLab
from tests.testbed.patience import patient

pytestmark = pytest.mark.slow

EPOCHS = 6
#: Small enough for four CPU ranks on two cores, big enough that an epoch takes seconds.
CIFAR_ARGS = ["--epochs", str(EPOCHS), "--width", "8", "--batch-size", "32", "--synthetic-train", "1024",
              "--synthetic-test", "64", "--workers", "0", "--progress", "off"]


def _training_job(lab: SSHLab, out_dir: Path, **extra: object) -> Path:
    job = write_job(lab, str(REPO / "jobs" / "cifar10.py"), nproc=1, name="ft",
                    args=[*CIFAR_ARGS, "--out-dir", str(out_dir)], env={"OMP_NUM_THREADS": "1"})
    data = yaml.safe_load(job.read_text())
    # preload as jobs/cifar10.yaml: a restart's workers fork with torchvision imported
    data.update({"nodes": "3:4", "restarts": 2, "python": sys.executable, "preload": ["torchvision"], **extra})
    job.write_text(yaml.safe_dump(data))
    return job


def _wait_for_file(path: Path, head, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert head.proc.poll() is None and time.monotonic() < deadline, head.output()
        time.sleep(0.05)


def _wait_stderr(head, pattern: str, timeout: float = 60.0) -> float:  # type: ignore[no-untyped-def]
    """Block until a stderr line matches; return when (monotonic)."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + patient(timeout)
    while not any(regex.search(line) for line in list(head.stderr)):
        assert time.monotonic() < deadline, f"no stderr line {pattern!r}:\n{head.output()}"
        time.sleep(0.02)
    return time.monotonic()


def _epochs_done(head) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(m.group(1)) for line in head.stdout for m in [re.search(r"epoch (\d+)/\d+: train loss", line)] if m]


def test_dead_host_restarts_job_on_live_hosts_from_checkpoint(lab4: SSHLab, head_factory, tmp_path: Path) -> None:
    """nodes 3:4, restarts 2, 4 hosts: after the first checkpoint cdssh4 dies (link cut, every
    process in it killed). The job restarts on the 3 live hosts, resumes from the checkpoint,
    finishes every epoch with exit 0, and nothing of it is left on any host."""
    out = tmp_path / "out"
    job = _training_job(lab4, out)
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    checkpoint = out / "checkpoints" / "last.pt"
    _wait_for_file(checkpoint, head)
    time.sleep(1.5)  # mid-epoch: the steps since the checkpoint are the work lost
    saved_at = checkpoint.stat().st_mtime
    dead = lab4.host("cdssh4")
    lab4.cut(dead)
    died = time.monotonic()
    died_wall = time.time()
    for pid in lab4.processes(dead, include_sshd=True):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    restarted = _wait_stderr(head, r"restart 1: 3 host\(s\) cdssh1,cdssh2,cdssh3 \(world size 3\)")
    resumed_line = head.wait_for(r"resumed from .*ckpt-\d+\.pt at epoch \d+", timeout=120)[0]
    resumed = time.monotonic()
    code = head.finish(240)
    stderr = "\n".join(head.stderr)
    assert code == 0, head.output()
    assert re.search(r"attempt 1 failed \(cdssh4: connection lost", stderr), stderr
    assert "left out: cdssh4 (connection lost in attempt 1)" in stderr, stderr
    assert re.search(r"attempt 1: 4 host\(s\) \(world size 4\) .*: exit 255", stderr), stderr
    assert re.search(r"attempt 2: 3 host\(s\) \(world size 3\) cdssh1,cdssh2,cdssh3: finished", stderr), stderr
    resumed_epoch = int(re.search(r"at epoch (\d+)", resumed_line).group(1))  # type: ignore[union-attr]
    assert resumed_epoch >= 1
    assert _epochs_done(head)[-1] == EPOCHS, head.output()
    assert sorted(set(_epochs_done(head))) == list(range(1, EPOCHS + 1)), head.output()
    assert "3 rank(s)" in "\n".join(head.stdout), head.output()
    live = [h for h in lab4.hosts if h.name != "cdssh4"]
    deadline = time.monotonic() + 10
    while any(lab4.processes(h) for h in live) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(lab4.processes(h) for h in live), {h.name: lab4.processes(h) for h in live}
    assert not lab4.processes(dead, include_sshd=True)
    print(f"dead host: death -> restart line {restarted - died:.1f}s, -> resumed {resumed - died:.1f}s; "
          f"work lost: the {died_wall - saved_at:.1f}s since the checkpoint (resumed at epoch {resumed_epoch})")


def test_killed_launcher_restarts_on_all_four_hosts(lab4: SSHLab, head_factory, tmp_path: Path) -> None:
    """Only cdssh4's launcher is killed (-9), the host stays up: the restart uses all 4 hosts."""
    out = tmp_path / "out"
    job = _training_job(lab4, out)
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    _wait_for_file(out / "checkpoints" / "last.pt", head)
    killed = time.monotonic()
    os.kill(_launcher_pid(lab4, "cdssh4"), signal.SIGKILL)
    restarted = _wait_stderr(head, r"restart 1: 4 host\(s\) cdssh1,cdssh2,cdssh3,cdssh4 \(world size 4\)")
    head.wait_for(r"resumed from .*ckpt-\d+\.pt at epoch", timeout=120)
    code = head.finish(240)
    assert code == 0, head.output()
    stderr = "\n".join(head.stderr)
    assert re.search(r"attempt 1 failed \(cdssh4", stderr), stderr
    assert "left out" not in stderr, stderr
    assert _epochs_done(head)[-1] == EPOCHS, head.output()
    clean, seconds, left = lab4.wait_clean(10)
    assert clean, left
    print(f"killed launcher: kill -> restart line {restarted - killed:.1f}s")


def test_uneven_hosts_get_prefix_sum_ranks(lab4: SSHLab, head_factory, tmp_path: Path) -> None:
    """Slots 2, 1, 1: ranks 0-3 in node order, LOCAL_WORLD_SIZE per host, one gloo group of 4."""
    hostfile = lab4.root / "uneven"
    hostfile.write_text("cdssh1 slots=2\ncdssh2:1\ncdssh3 slots=1\n")
    out = tmp_path / "contract"
    out.mkdir()
    job = write_job(lab4, "contract.py", env={"OUT_DIR": str(out), "OMP_NUM_THREADS": "1"})
    dry = head_factory(str(job), "--hostfile", str(hostfile), "--dry-run")
    assert dry.finish(60) == 0, dry.output()
    table = "\n".join(dry.stdout)
    assert "3 hosts x (2+1+1) workers = world size 4" in table, table
    assert re.search(r"0\s+cdssh1\s+\S+\s+0-1\s", table) and re.search(r"1\s+cdssh2\s+\S+\s+2\s", table), table
    assert re.search(r"2\s+cdssh3\s+\S+\s+3\s", table), table
    assert "--workers-per-node 2,1,1" in table, table
    head = head_factory(str(job), "--hostfile", str(hostfile))
    assert head.finish(120) == 0, head.output()
    records = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(4)}
    expected = {0: ("cdssh1", "0", "2", "0"), 1: ("cdssh1", "1", "2", "0"),
                2: ("cdssh2", "0", "1", "1"), 3: ("cdssh3", "0", "1", "2")}
    for rank, (host, local, local_world, group) in expected.items():
        record = records[rank]
        assert (record["host"], record["LOCAL_RANK"], record["LOCAL_WORLD_SIZE"], record["GROUP_RANK"]) == \
            (host, local, local_world, group), record
        assert record["WORLD_SIZE"] == "4" and record["GROUP_WORLD_SIZE"] == "3" and record["world"] == 4
        assert record["sum"] == 6.0 and record["rank"] == rank
    assert lab4.wait_clean(5)[0]


def test_restarts_used_up_report_every_attempt(lab4: SSHLab, head_factory, tmp_path: Path) -> None:
    """A rank that always fails: restarts 1 gives 2 attempts on the same hosts (a rank's exit is
    no reason to leave its node out), a line per restart, a line per attempt, the failure's exit."""
    job = write_job(lab4, str(REPO / "tests" / "bin" / "exit_with.py"), nproc=1, args=["3"])
    data = yaml.safe_load(job.read_text())
    data.update({"nodes": "2:3", "restarts": 1})
    job.write_text(yaml.safe_dump(data))
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    code = head.finish(120)
    stderr = "\n".join(head.stderr)
    assert code == 3, head.output()
    assert len(re.findall(r"restarting the whole job in 0s \(restart 1 of 1\)", stderr)) == 1, stderr
    assert "restart 1: 3 host(s) cdssh1,cdssh2,cdssh3 (world size 3); not used: cdssh4: spare (nodes: at most 3)" \
        in stderr, stderr
    assert "2 attempts:" in stderr and stderr.count(": exit 3 after") == 2, stderr
    assert lab4.wait_clean(5)[0]


def test_a_stop_signal_during_the_backoff_stops_the_head_at_once(lab4: SSHLab, head_factory) -> None:
    """SIGTERM to the head while it waits out a 2 s backoff (the third restart's: 0 s, 1 s, 2 s):
    no further attempt, exit 143 (128+N, as a launcher on one node), every attempt reported,
    nothing left on the hosts."""
    job = write_job(lab4, str(REPO / "tests" / "bin" / "exit_with.py"), nproc=1, args=["3"])
    data = yaml.safe_load(job.read_text())
    data.update({"restarts": 3})
    job.write_text(yaml.safe_dump(data))
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    _wait_stderr(head, r"restarting the whole job in 2s \(restart 3 of 3\)", timeout=90)
    head.proc.send_signal(signal.SIGTERM)
    code = head.finish(30)
    stderr = "\n".join(head.stderr)
    assert code == 143, head.output()  # how soon after the SIGTERM: a figure for benchmarks/, not a test
    assert "SIGTERM before the restart: not restarting" in stderr and "3 attempts:" in stderr, stderr
    assert "restart 3:" not in stderr, stderr
    assert lab4.wait_clean(5)[0]


@pytest.mark.parametrize("exit_code", [75, 65])
def test_preempted_or_nonfinite_is_never_restarted(lab4: SSHLab, head_factory, exit_code: int) -> None:
    """Exit 75 (preempted: the scheduler's business) and 65 (non-finite loss) end the job at once."""
    job = write_job(lab4, str(REPO / "tests" / "bin" / "exit_with.py"), nproc=1, args=[str(exit_code)])
    data = yaml.safe_load(job.read_text())
    data.update({"restarts": 3})
    job.write_text(yaml.safe_dump(data))
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish(120) == exit_code, head.output()
    assert "restart" not in "\n".join(head.stderr).replace("--restart", ""), head.output()
    assert lab4.wait_clean(5)[0]


def test_fewer_than_min_hosts_names_each_host(lab4: SSHLab, head_factory) -> None:
    """nodes 3:4 with two hosts down: one line per host and why, exit 2, nothing started."""
    lab4.stop_sshd(lab4.host("cdssh2"))
    lab4.stop_sshd(lab4.host("cdssh3"))
    job = write_job(lab4, "wait_forever.py", nproc=1)
    data = yaml.safe_load(job.read_text())
    data.update({"nodes": "3:4"})
    job.write_text(yaml.safe_dump(data))
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish(60) == 2, head.output()
    stderr = "\n".join(head.stderr)
    assert "2 host(s) ready, the job needs at least 3 (nodes: 3:4)" in stderr, stderr
    assert re.search(r"cdssh2 .*connection refused", stderr) and re.search(r"cdssh3 .*connection refused", stderr)
    assert not head.stdout
    assert lab4.wait_clean(2)[0]


def test_cut_link_restarts_job_from_checkpoint(lab2: SSHLab, head_factory, tmp_path: Path) -> None:
    """A cut link, one of issue 25's transient faults, on 2 hosts x 1 gloo worker, a fixed node
    count, ``restarts: 2`` (tests/bin/transient_fault.py ``link``: a checkpoint per step). Once
    attempt 0 made progress (both ranks checkpointed step 2, rank 1 then waits in step 2),
    cdssh2's link is cut; the head notices (no TCP acknowledgement for ``ssh.link_timeout``, 1 s)
    and names the host in the attempt's report; then the link comes back. The head restarts the
    whole job (the full way: cdssh2's session is gone, so no restart in place), attempt 1
    resumes from the checkpoint at step 2 on both hosts, the job finishes with exit 0, and
    nothing is left running.

    The link is restored as soon as the head's report names cdssh2, before the restart's probe:
    with a fixed ``nodes`` every listed host must pass that probe, and a host still cut off
    fails it (``attempt.prepare`` raises PreflightError, ``fanout.HeadLoop`` in PROBING says "restart 1: ..."
    and ends the job with the last attempt's exit, 255), as a fixed-size job must when a node
    is gone for good (an elastic job would leave it out, the test above). cdssh2's launcher of
    attempt 0, cut off, stops on its own: once the link is back the head's kernel answers the
    connection it gave up on with a reset and the launcher's stdin ends (here about 0.6 s after
    the report), or, the link still down, when no keepalive came for 6 s; while it is stopping,
    attempt 1's launcher there waits for it to let go of rank 1's log lock (``local.lock_logs``)."""
    job = write_job(lab2, str(REPO / "tests" / "bin" / "transient_fault.py"), nproc=1, name="cut",
                    args=["link", str(tmp_path)], env={"OMP_NUM_THREADS": "1"})
    data = yaml.safe_load(job.read_text())
    data.update({"restarts": 2, "python": sys.executable})
    job.write_text(yaml.safe_dump(data))
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile), "--run-id", "cut")
    _wait_for_file(tmp_path / "fault.pid", head, timeout=90)  # rank 1 (cdssh2) in step 2, both checkpointed 2
    cut_host = lab2.host("cdssh2")
    lab2.cut(cut_host)
    cut = time.monotonic()
    try:
        noticed = _wait_stderr(head, r"failed on cdssh2: connection lost", timeout=30)
    finally:
        lab2.restore(cut_host)
    restarted = _wait_stderr(head, r"^clusterddp: restart 1: 2 host\(s\) cdssh1,cdssh2 \(world size 2\)$")
    code = head.finish(120)
    finished = time.monotonic()
    stderr = "\n".join(head.stderr)
    assert code == 0, head.output()
    assert re.search(r"attempt 1 failed \(cdssh2: connection lost .*restarting the whole job in 0s "
                     r"\(restart 1 of 2\)", stderr), stderr
    assert "in place" not in stderr and "not restarting" not in stderr, stderr
    assert re.search(r"attempt 1: 2 host\(s\) \(world size 2\) cdssh1,cdssh2: exit 255", stderr), stderr
    assert re.search(r"attempt 2: 2 host\(s\) \(world size 2\) cdssh1,cdssh2: finished", stderr), stderr
    ends = [e for e in map(json.loads, (tmp_path / "logs" / "cut" / "events.jsonl").read_text().splitlines())
            if e["kind"] == "attempt_end"]
    assert [e["verdict"] for e in ends] == ["restart", "stop"], ends
    stdout = "\n".join(head.stdout)
    for rank in (0, 1):
        assert (tmp_path / f"start.rank{rank}.attempt0").read_text() == "0"
        assert (tmp_path / f"start.rank{rank}.attempt1").read_text() == "2"  # resumed, not from step 0
        assert (tmp_path / f"ckpt.rank{rank}").read_text() == "4"
        assert f"rank {rank} finished at step 4 (attempt 1, resumed at 2)" in stdout, head.output()
    clean, seconds, left = lab2.wait_clean(6.0 + 2 + 2)  # a launcher cut off stops within its keepalive timeout
    assert clean, left
    print(f"cut link: cut -> named {noticed - cut:.1f}s, -> restart line {restarted - cut:.1f}s, "
          f"-> job done {finished - cut:.1f}s; hosts clean {seconds:.1f}s after")
