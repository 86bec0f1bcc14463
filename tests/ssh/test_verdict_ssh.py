"""The restart verdict and the event log over SSH, on real sshd hosts: the head judges the root
cause as a launcher alone does, writes its own events, and its report covers every host."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import paramiko
import pytest
import yaml

from clusterddp.hostfile import entries_from_list
from clusterddp.launch.ssh.headlog import Gatherer
from clusterddp.protocol import events_copy_name as copy_name
from clusterddp.launch.ssh.hosts import resolve_hosts
from clusterddp.launch.ssh.io import Console, RemoteLauncher
from clusterddp.launch.ssh.reach import ConnectSettings, HostSession, LaunchPlan, open_client
from clusterddp.protocol import write_launcher_file
from clusterddp.sections.ssh import SSHSpec
from tests.conftest import cli, cli_env
from tests.ssh.conftest import Head
from tests.testbed import SSHLab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

ATTEMPT = "import os\nattempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"


def _job(lab: SSHLab, script: str, restarts: int = 2, nproc_per_node: int = 1) -> Path:
    (lab.root / "train.py").write_text(script)
    data = {"name": "v", "script": str(lab.root / "train.py"), "nproc_per_node": nproc_per_node, "grace_period": 1,
            "restarts": restarts, "env": {"OMP_NUM_THREADS": "1"},
            "ssh": {"config_file": str(lab.ssh_config), "connect_timeout": 3}}
    path = lab.root / "v.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _head_events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _report(tmp_path: Path, run_id: str) -> str:
    done = cli("report", run_id, "--log-dir", str(tmp_path / "logs"), cwd=tmp_path, env=cli_env())
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_error_is_not_restarted_by_the_head(lab2: SSHLab, head_factory: Callable[..., Head], tmp_path: Path) -> None:
    """An ImportError on every host with restarts: 2 stops after one attempt, with one line; the head's events and report cover both hosts."""
    job = _job(lab2, "import os\nfrom os import no_such_name_cddp\n")
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile), "--run-id", "imp")
    code = head.finish(120)
    stderr = "\n".join(head.stderr)
    assert code == 1, head.output()
    assert stderr.count("not restarting") == 1, stderr
    assert re.search(r"^clusterddp: not restarting: ImportError at train\.py:2 before any progress: it will fail "
                     r"the same way again$", stderr, re.M), stderr
    assert "restarting the whole job" not in stderr, stderr
    events = _head_events(tmp_path / "logs" / "imp")
    assert [e["kind"] for e in events] == ["run_start", "attempt_start", "attempt_end", "run_end"], events
    end = events[2]
    assert end["verdict"] == "stop" and end["failure"] == "ImportError at train.py:2", end
    assert "ImportError at train.py:2 before any progress" in end["why"], end
    report = _report(tmp_path, "imp")
    print(report)
    for host in ("cdssh1", "cdssh2"):
        assert re.search(rf"{host}\s+attempt 0\s+attempt_end", report), report
    assert "1 attempt(s)" in report, report
    assert lab2.wait_clean(5)[0]


def test_killed_rank_is_restarted_by_the_head(lab2: SSHLab, head_factory: Callable[..., Head], tmp_path: Path) -> None:
    """A rank SIGKILLed after its first step is restarted; the head's attempt_end says restart, then stop on success."""
    job = _job(lab2, ATTEMPT + "import signal, time\nfrom clusterddp.train import heartbeat\nheartbeat()\n"
               "time.sleep(0.5)\nif attempt == 0 and os.environ['RANK'] == '1':\n"
               "    os.kill(os.getpid(), signal.SIGKILL)\n")
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile), "--run-id", "kill")
    code = head.finish(120)
    stderr = "\n".join(head.stderr)
    assert code == 0, head.output()
    assert "not restarting" not in stderr, stderr
    assert "restarting the whole job in 0s (restart 1 of 2)" in stderr, stderr
    events = _head_events(tmp_path / "logs" / "kill")
    ends = [e for e in events if e["kind"] == "attempt_end"]
    assert [(e["verdict"], e["failure"]) for e in ends] == [("restart", "SIGKILL"), ("stop", None)], ends
    assert [e["kind"] for e in events].count("restart") == 1, events
    report = _report(tmp_path, "kill")
    print(report)
    assert "2 attempt(s)" in report, report
    for host in ("cdssh1", "cdssh2"):
        for attempt in (0, 1):
            assert re.search(rf"{host}\s+attempt {attempt}\s+first_step", report), report
    assert lab2.wait_clean(5)[0]


def _launcher(lab: SSHLab, name: str, node_rank: int) -> RemoteLauncher:
    config = paramiko.SSHConfig.from_path(str(lab.ssh_config))
    (host,) = resolve_hosts(entries_from_list([name], "test"), SSHSpec(config_file=str(lab.ssh_config)), config)
    client = open_client(host, ConnectSettings(timeout=3))
    transport = client.get_transport()
    assert transport is not None
    channel = transport.open_session()
    session = HostSession(host=host, node_rank=node_rank, client=client, channel=channel)
    return RemoteLauncher(session, LaunchPlan(host=name, node_rank=node_rank, nproc=1, argv=()), log=None)  # type: ignore[arg-type]


def test_gather_fetches_a_host_file_only_where_the_directory_is_not_shared(lab2: SSHLab, tmp_path: Path) -> None:
    """A host whose run dir is not the head's gets its events copied over SSH; a shared one is left alone."""
    head_dir = tmp_path / "head" / "r"
    head_dir.mkdir(parents=True)
    write_launcher_file(head_dir, "head", "r", [0, 1])
    elsewhere = lab2.root / "elsewhere" / "r"  # another directory: what a host without the shared filesystem has
    elsewhere.mkdir(parents=True)
    (elsewhere / "events.node1.jsonl").write_text('{"t":1.0,"kind":"run_start"}\n')
    (head_dir / "events.node0.jsonl").write_text('{"t":1.0,"kind":"run_start"}\n')
    console = Console(open("/dev/null", "wb"), open("/dev/null", "wb"))
    far, near = _launcher(lab2, "cdssh2", 1), _launcher(lab2, "cdssh1", 0)
    try:
        Gatherer(str(elsewhere), head_dir, console, 3).gather([far])
        assert (head_dir / copy_name(1, "cdssh2")).read_text() == '{"t":1.0,"kind":"run_start"}\n'
        shared = Gatherer(str(head_dir), head_dir, console, 3)
        shared.gather([near])
        assert shared.shared == {"cdssh1": True}
        assert sorted(p.name for p in head_dir.glob("events*")) == ["events.node0.jsonl", copy_name(1, "cdssh2")]
    finally:
        for launcher in (far, near):
            launcher.session.close()


def test_a_race_on_one_rank_of_four_is_restarted_by_the_head(lab2: SSHLab, head_factory: Callable[..., Head],
                                                              tmp_path: Path) -> None:
    """Rank 1 (the first host's second) fails before any progress in attempt 0 only, ranks 0, 2, 3 are
    healthy: the head judges from every host's ranks, restarts, and the job finishes."""
    job = _job(lab2, ATTEMPT + "if int(os.environ['RANK']) == 1 and attempt == 0:\n"
               "    os.listdir('/nonexistent-cddp/ck')\nif attempt == 0:\n    import time; time.sleep(300)\n",
               nproc_per_node=2)
    head = head_factory(str(job), "--hostfile", str(lab2.hostfile), "--run-id", "race")
    code = head.finish(180)
    stderr = "\n".join(head.stderr)
    assert code == 0, head.output()
    assert re.search(r"^clusterddp: restarting: FileNotFoundError at train\.py:4 on rank 1 only; ranks 0,2,3 were "
                     r"healthy$", stderr, re.M), stderr
    assert "not restarting" not in stderr, stderr
    assert lab2.wait_clean(5)[0]
