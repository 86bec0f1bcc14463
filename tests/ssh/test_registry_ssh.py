"""The SSH head in the run registry (issue 33): it records its run (target ssh, the hosts it
picked, its own pid), ``ls`` shows it running, ``stop RUN`` ends every rank on every host
through the head, and the record says stopped; a finished run says finished on its hosts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ssh.conftest import REPO, write_job
from tests.ssh.test_fanout import _assert_clean
from tests.testbed import SSHLab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def cddp(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd,
                          env={**os.environ, "CLUSTERDDP_HOME": str(home)}, capture_output=True, text=True,
                          timeout=300)


def test_the_head_records_its_run_and_stop_by_run_id_ends_every_host(lab2: SSHLab, head_factory,
                                                                      tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(lab2, "wait_forever.py", name="waits")
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile), env={"CLUSTERDDP_HOME": str(home)})
    head.wait_for(r"ready rank", count=4)
    runs = json.loads(cddp(home, tmp_path, "ls", "--json").stdout)["runs"]
    [run] = runs
    assert (run["target"], run["state"], run["job"]) == ("ssh", "running", "waits"), run
    stop = cddp(home, tmp_path, "stop", run["run_id"])
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert head.finish(60) == 143, head.output()
    _assert_clean(lab2, 10)
    [after] = json.loads(cddp(home, tmp_path, "ls", "--json").stdout)["runs"]
    assert (after["state"], after["exit_code"]) == ("stopped", 143), after
    assert sorted(after["hosts"]) == ["cdssh1", "cdssh2"], after

    hello = write_job(lab2, str(REPO / "jobs" / "hello.py"), name="hello")
    second = head_factory(str(hello), "--hostfile", str(lab2.hostfile), env={"CLUSTERDDP_HOME": str(home)})
    assert second.finish() == 0, second.output()
    done = {r["job"]: r for r in json.loads(cddp(home, tmp_path, "ls", "--json").stdout)["runs"]}["hello"]
    assert (done["state"], done["exit_code"], done["attempts"]) == ("finished", 0, 1), done
    assert sorted(done["hosts"]) == ["cdssh1", "cdssh2"]
    _assert_clean(lab2, 10)
