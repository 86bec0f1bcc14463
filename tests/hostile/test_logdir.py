"""The run's log directory under faults and misuse: a disk that turns read-only between
attempts, and two launchers that would write the same ranks' logs (issue 17, items 2 and 5)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from clusterddp.launch.supervise import runlock
from tests.conftest import BIN, cli, start_cli, wait_for, write_job
from tests.ssh.conftest import Head
from tests.ssh.conftest import write_job as ssh_job
from tests.testbed import lab_unavailable_reason, ssh_lab


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """A read-only tmpfs holding a stale ``rank0.error.json`` (an earlier attempt's), and a
    function that mounts it over a directory mid-run; everything unmounted whatever happens.

    A real read-only filesystem, not a chmod (root writes through any mode), and mounted over
    the run's directory because ``remount,ro`` is refused (EBUSY) while the launcher holds the
    log files open for writing; the effect on what the launcher opens next is the same."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    mounted = [disk]
    try:
        (disk / "rank0.error.json").write_text(json.dumps({"message": "a stale error of another attempt"}))
        done = _mount("-o", "remount,ro", str(disk))
        assert done.returncode == 0, done.stderr

        def over(target: Path) -> None:
            bound = _mount("--bind", str(disk), str(target))
            assert bound.returncode == 0, bound.stderr
            mounted.append(target)

        yield over
    finally:
        for path in reversed(mounted):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _run_turning_read_only(tmp_path: Path, read_only_disk: Callable[[Path], None],
                           *args: str) -> tuple[subprocess.Popen[str], str, str]:
    """Run fail_until_readonly.py with ``restarts: 1``; make the run's log directory read-only
    while attempt 0 runs (its rank then exits 7)."""
    run_dir = tmp_path / "logs" / "ro"
    job = write_job(tmp_path, script="fail_until_readonly.py", args=[str(run_dir), *args], nproc_per_node=1,
                    restarts=1, grace_period=1)
    proc = start_cli("run", str(job), "--run-id", "ro")
    try:
        assert wait_for(lambda: b"attempt 0" in (run_dir / "rank0.log").read_bytes()
                        if (run_dir / "rank0.log").exists() else False, timeout=600)
        read_only_disk(run_dir)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, out, err


def test_a_log_dir_turned_read_only_does_not_stop_the_restart(tmp_path: Path,
                                                              read_only_disk: Callable[[Path], None]) -> None:
    """Log dir read-only after attempt 0 started: the restart runs console-only and the job exits 0."""
    proc, out, err = _run_turning_read_only(tmp_path, read_only_disk)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    assert "rank 0 attempt 1" in out
    warnings = [line for line in err.splitlines() if "cannot write its log" in line]
    assert len(warnings) == 1 and os.strerror(errno.EROFS) in warnings[0], err


def test_a_stale_error_file_on_a_read_only_disk_is_not_the_root_cause(
        tmp_path: Path, read_only_disk: Callable[[Path], None]) -> None:
    """The restart fails too: the report shows its own stderr, not the error file it could not remove."""
    proc, out, err = _run_turning_read_only(tmp_path, read_only_disk, "always")
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 7, err[-3000:]
    last_lines = err.split("last lines:", 1)[1]
    assert "attempt 1 failed on its own" in last_lines
    assert "stale error" not in err


# -- one launcher per rank log -------------------------------------------------------------------

def _waiting_job(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[str], Path]:
    """A launcher whose ranks print, say they are ready, and wait for ``tmp_path/finish``."""
    ready = tmp_path / "ready"
    ready.mkdir(exist_ok=True)
    proc = start_cli("run", "--log-dir", str(tmp_path / "logs"), "--grace-period", "1", *flags, "--",
                     str(BIN / "wait_for_file.py"), str(ready), str(tmp_path / "finish"))
    return proc, ready


def _finish(*procs: subprocess.Popen[str]) -> list[tuple[int, str, str]]:
    """Let the waiting ranks end; every launcher's (exit code, stdout, stderr)."""
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        results.append((proc.returncode, out, err))
    return results


def test_a_second_job_with_the_same_run_id_is_refused(tmp_path: Path) -> None:
    """A second launcher with a running job's run id: one line, exit 2, the first job's log untouched."""
    first, ready = _waiting_job(tmp_path, "--nproc-per-node", "1", "--run-id", "same")
    try:
        assert wait_for(lambda: (ready / "rank0.ready").exists(), timeout=60)
        second = cli("run", "--nproc-per-node", "1", "--run-id", "same", "--log-dir", str(tmp_path / "logs"),
                     "--", str(BIN / "exit_with.py"), "0", timeout=600)
    finally:
        (tmp_path / "finish").touch()
        [(code, _, err)] = _finish(first)
    assert second.returncode == 2, second.stderr
    assert len(second.stderr.splitlines()) == 1 and "holds rank 0's log; two jobs must not share a run id" in second.stderr
    assert f"pid {first.pid} on" in second.stderr
    assert "Traceback" not in second.stderr and "exiting with 0" not in second.stderr
    assert code == 0, err
    assert (tmp_path / "logs" / "same" / "rank0.log").read_text() == "rank 0 started\nrank 0 done\n"


def test_two_nodes_of_one_job_on_one_host_share_the_run_dir(tmp_path: Path) -> None:
    """Node 0 and node 1 of one job on one machine, same run id and log dir: both run, each its own ranks."""
    port = str(29700 + os.getpid() % 200)
    node = ("--nproc-per-node", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port,
            "--run-id", "shared")
    nodes = [_waiting_job(tmp_path, *node, "--node-rank", str(rank))[0] for rank in (0, 1)]
    try:
        assert wait_for(lambda: len(list((tmp_path / "ready").glob("rank*.ready"))) == 4, timeout=60), \
            [p.stderr.read() if p.poll() is not None and p.stderr else "" for p in nodes]
    finally:
        (tmp_path / "finish").touch()
        results = _finish(*nodes)
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    for rank in range(4):
        assert (tmp_path / "logs" / "shared" / f"rank{rank}.log").read_text() == f"rank {rank} started\nrank {rank} done\n"


def test_a_killed_launcher_leaves_no_lock_behind(tmp_path: Path) -> None:
    """kill -9 of a launcher frees its run id at once: the next launcher with it runs (exit 0)."""
    first, ready = _waiting_job(tmp_path, "--nproc-per-node", "1", "--run-id", "again")
    try:
        assert wait_for(lambda: (ready / "rank0.ready").exists(), timeout=60)
        first.kill()
        first.communicate(timeout=600)
        (tmp_path / "finish").touch()
        second = cli("run", "--nproc-per-node", "1", "--run-id", "again", "--log-dir", str(tmp_path / "logs"),
                     "--", str(BIN / "exit_with.py"), "0", timeout=600)
    finally:
        (tmp_path / "finish").touch()
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "logs" / "again" / "rank0.log").read_text() == "rank 0 exiting with 0\n"


def test_a_restart_attempt_waits_for_the_previous_launcher(tmp_path: Path) -> None:
    """--restart-count 1 meets its rank still locked (the previous attempt stopping): it waits, then runs."""
    run_dir = tmp_path / "logs" / "restarted"
    held = runlock.lock_ranks(str(run_dir), [0], "logs.dir", "restarted")
    try:
        proc = start_cli("run", "--nproc-per-node", "1", "--run-id", "restarted", "--restart-count", "1",
                         "--log-dir", str(tmp_path / "logs"), "--", str(BIN / "exit_with.py"), "0")
        assert proc.stderr is not None
        note = proc.stderr.readline()
        assert "(pid " in note and "still holds rank 0's log of run 'restarted'" in note and "waiting up to" in note, note
        assert proc.poll() is None  # still waiting, nothing started
        assert not (run_dir / "rank0.log").exists()
    finally:
        held.release()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert (run_dir / "rank0.log").read_text().endswith("---\nrank 0 exiting with 0\n")  # after the restart marker


@pytest.mark.ssh
@pytest.mark.slow
def test_a_second_ssh_head_with_the_same_run_id_is_refused(tmp_path: Path) -> None:
    """Two SSH heads, one run id: the second ends with one error line, exit 2, before any host starts."""
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    ready, finish = tmp_path / "ready", tmp_path / "finish"
    ready.mkdir()
    with ssh_lab(2) as lab:
        job = ssh_job(lab, str(BIN / "wait_for_file.py"), nproc=1, args=[str(ready), str(finish)])
        argv = [str(job), "--hostfile", str(lab.hostfile), "--run-id", "twice"]
        first = Head(argv, cwd=tmp_path)
        try:
            assert wait_for(lambda: len(list(ready.glob("rank*.ready"))) == 2, timeout=90), first.output()
            second = Head(argv, cwd=tmp_path)
            try:
                code = second.finish(timeout=600)
            finally:
                second.kill()
        finally:
            finish.touch()
            try:
                first_code = first.finish(timeout=600)
            finally:
                first.kill()
    assert code == 2, second.output()
    assert "holds the SSH head's files; two jobs must not share a run id" in second.stderr[-1], second.output()
    assert not any("rank" in line for line in second.stdout + second.stderr[:-1]), second.output()
    assert "Traceback" not in second.output()
    assert first_code == 0, first.output()
    for rank in (0, 1):
        assert (tmp_path / "logs" / "twice" / f"rank{rank}.log").read_text() == \
            f"rank {rank} started\nrank {rank} done\n"
