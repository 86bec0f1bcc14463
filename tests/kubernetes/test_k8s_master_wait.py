"""Node 0's DNS name may not exist yet when a pod starts: the launcher waits, bounded, for the master
address to resolve, says so, and stops with one line when it never does.

Real launchers, each in a private mount namespace (``unshare -m``) whose /etc/hosts is a file the
test owns and whose resolver reads only that file: adding a line there is node 0's pod coming up.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, cli, cli_env, wait_for, write_job

needs_unshare = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")


def _in_private_hosts(tmp_path: Path, args: list[str]) -> tuple[list[str], Path]:
    """The command that runs the launcher with /etc/hosts (and a files-only nsswitch.conf) replaced by
    files under ``tmp_path``; returns it and the hosts file to edit."""
    hosts, nsswitch = tmp_path / "hosts", tmp_path / "nsswitch.conf"
    hosts.write_text("127.0.0.1 localhost\n")
    nsswitch.write_text("hosts: files\n")
    script = (f"mount --bind {hosts} /etc/hosts && mount --bind {nsswitch} /etc/nsswitch.conf && "
              f'exec "$0" -m clusterddp "$@"')
    return ["unshare", "-m", "sh", "-c", script, sys.executable, *args], hosts


def _mount_namespaces_allowed() -> None:
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -m is not allowed here: {probe.stderr.decode().strip()}")


def pod_env(master: str, **extra: str) -> dict[str, str]:
    """A one-node JobSet pod whose master is ``master`` (its own name, as node 0 sees it)."""
    return cli_env(CLUSTERDDP_JOBSET_MASTER_ADDR=master, CLUSTERDDP_JOBSET_NNODES="1", JOB_COMPLETION_INDEX="0",
                   **extra)


@needs_unshare
def test_a_master_name_that_never_resolves_is_one_line_after_the_wait(tmp_path: Path) -> None:
    """CLUSTERDDP_MASTER_WAIT=2 and a name that never resolves: a waiting line, then one error line, exit 2,
    after at least 1.5 s, and no worker started."""
    _mount_namespaces_allowed()
    job = write_job(tmp_path, script="dump_env.py", nproc_per_node=1, args=[str(tmp_path)])
    env = pod_env("rank0.never.invalid", CLUSTERDDP_MASTER_WAIT="2")
    command, _ = _in_private_hosts(tmp_path, ["run", str(job)])
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert any(line.startswith("clusterddp: waiting up to 2 s for master address rank0.never.invalid to resolve")
               for line in lines), lines
    errors = [line for line in lines if line.startswith("clusterddp: error:")]
    assert errors == [lines[-1]] and "master address rank0.never.invalid did not resolve within 2 s" in errors[0]
    assert "CLUSTERDDP_MASTER_WAIT" in errors[0] and "Traceback" not in result.stderr
    assert elapsed >= 1.5
    assert not (tmp_path / "rank0.json").exists() and not (tmp_path / "logs").exists()


@needs_unshare
def test_a_master_name_that_appears_later_lets_the_job_run(tmp_path: Path) -> None:
    """The name resolves only once a line is added to /etc/hosts 2 s in: the launcher waits, says it resolved,
    and the worker runs with that MASTER_ADDR."""
    _mount_namespaces_allowed()
    job = write_job(tmp_path, script="dump_env.py", nproc_per_node=1, args=[str(tmp_path)])
    env = pod_env("cifar-node-0-0.cifar", CLUSTERDDP_MASTER_WAIT="60")
    command, hosts = _in_private_hosts(tmp_path, ["run", str(job)])
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            waiting = "for master address cifar-node-0-0.cifar to resolve"
            assert wait_for(lambda: waiting in stderr.read_text(), timeout=30), stderr.read_text()
            time.sleep(2)
            assert proc.poll() is None and not (tmp_path / "rank0.json").exists()  # still waiting, nothing started
            with hosts.open("a") as f:
                f.write("127.0.0.1 cifar-node-0-0.cifar\n")
            assert proc.wait(timeout=600) == 0, stderr.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "clusterddp: master address cifar-node-0-0.cifar resolves after" in stderr.read_text()
    assert '"MASTER_ADDR": "cifar-node-0-0.cifar"' in (tmp_path / "rank0.json").read_text()


def test_a_bad_master_wait_is_one_line() -> None:
    """CLUSTERDDP_MASTER_WAIT that is not a number of seconds: one line naming it, exit 2."""
    result = cli("run", "--nproc-per-node", "1", "--", "x.py", env=cli_env(CLUSTERDDP_MASTER_WAIT="soon"))
    assert result.returncode == 2 and result.stderr.startswith("clusterddp: error: CLUSTERDDP_MASTER_WAIT: ")
    assert len(result.stderr.strip().splitlines()) == 1
