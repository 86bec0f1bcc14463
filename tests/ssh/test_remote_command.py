"""Remote command building, env forwarding, ssh_config resolution and the stub: no sshd needed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from clusterddp.hostfile import HostEntry
from clusterddp.launch.ssh.hosts import resolve_hosts
from clusterddp.launch.ssh.attempt import forwarded_env, launcher_argv, launcher_env
from clusterddp.launch.ssh.reach import HeadFacts, HostSession, LaunchPlan, check_host, kill_command, stub_command
from clusterddp.sections.ssh import SSHSpec

TRICKY = ["it's", 'say "hi"', "$(id)", "`id`", "a b", "x\ny", ";", "\\", "*", "$HOME"]


def test_shell_line_round_trips() -> None:
    """The dry-run shell line parses back to exactly the argv and env the stub will exec."""
    plan = LaunchPlan(host="h", node_rank=0, nproc=1, argv=("/py", "-m", "clusterddp", "run", "--", *TRICKY),
                      env={"A": "$(id) 'q'", "B": "x\ny"}, cwd="/dir with space")
    words = shlex.split(plan.shell_line())
    assert words[:4] == ["cd", "/dir with space", "&&", "env"]
    assert words[4:6] == ["A=$(id) 'q'", "B=x\ny"]
    assert words[6:] == list(plan.argv)


def test_stub_command_quotes_the_interpreter() -> None:
    """The only shell line with input in it quotes the interpreter path and the stub source."""
    words = shlex.split(stub_command("/opt/my python/bin/python"))
    assert words[:3] == ["exec", "/opt/my python/bin/python", "-c"]
    assert "def probe(request" in words[3]  # the stub source itself, whatever its annotations


@pytest.mark.parametrize("pid,pgid,signal_name,expected", [
    (100, 100, "TERM", "kill -TERM -- -100 2>/dev/null; true"),
    (100, 7, "KILL", "kill -KILL 100 2>/dev/null; true"),
])
def test_kill_command(pid: int, pgid: int, signal_name: str, expected: str) -> None:
    """The fallback kill targets the launcher's group only when the launcher leads it."""
    assert kill_command(pid, pgid, signal_name) == expected


def test_kill_command_rejects_other_signals() -> None:
    """Only TERM and KILL are ever sent."""
    with pytest.raises(ValueError):
        kill_command(1, 1, "HUP; rm -rf /")


def test_forwarded_env_allow_list() -> None:
    """NCCL_*/GLOO_*/PYTHONPATH... travel; per-host variables (CUDA_VISIBLE_DEVICES, PATH) do not."""
    head = {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth1", "PYTHONPATH": "/src", "PATH": "/bin",
            "CUDA_VISIBLE_DEVICES": "0", "HOME": "/root", "WANDB_KEY": "k", "WANDB_MODE": "off"}
    assert forwarded_env(head) == {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth1", "PYTHONPATH": "/src"}
    assert forwarded_env(head, ["WANDB_*"])["WANDB_KEY"] == "k"


def test_launcher_env_precedence() -> None:
    """Detected interface fills GLOO/NCCL_SOCKET_IFNAME unless the head env or the job set them."""
    assert launcher_env({}, {}, "eth0") == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert launcher_env({"GLOO_SOCKET_IFNAME": "ib0"}, {}, "eth0") == {
        "GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert launcher_env({}, {"NCCL_SOCKET_IFNAME": "ib1", "X": "1"}, "eth0") == {
        "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "ib1", "X": "1"}


def test_launcher_argv_puts_command_last() -> None:
    """A job file goes first; a '--' command goes after every launcher flag."""
    common = dict(nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500, run_id="r", nproc=2,
                  keepalive_timeout=6.0)
    with_file = launcher_argv("/py", ["/jobs/a.yaml"], **common)
    assert with_file[:5] == ("/py", "-m", "clusterddp", "run", "/jobs/a.yaml")
    assert "--watch-stdin" in with_file and "--emit-result" in with_file
    no_file = launcher_argv("/py", ["--", "train.py", "--nnodes", "9"], extra=["--restarts", "1"], **common)
    assert no_file[-4:] == ("--", "train.py", "--nnodes", "9")
    assert no_file[no_file.index("--node-rank") + 1] == "1"


SSH_CONFIG = """\
Host n1
  HostName 10.1.0.1
  User alice
  Port 2222
  IdentityFile ~/keys/n1
Host n*
  UserKnownHostsFile /etc/kh /tmp/kh2
Host proxied
  ProxyJump bastion
"""


def test_resolve_hosts_precedence() -> None:
    """hostfile user@ > job ssh: > ssh_config > defaults, for HostName, User, Port, IdentityFile."""
    config = paramiko.SSHConfig.from_text(SSH_CONFIG)
    entries = [HostEntry("n1", 2, None, "h:1"), HostEntry("n2", None, "bob", "h:2"), HostEntry("other", None, None, "h:3")]
    n1, n2, other = resolve_hosts(entries, SSHSpec(), config)
    assert (n1.address, n1.port, n1.user, n1.slots) == ("10.1.0.1", 2222, "alice", 2)
    assert n1.identity_files == (os.path.expanduser("~/keys/n1"),)
    assert n1.known_hosts == ("/etc/kh", "/tmp/kh2")
    assert (n2.address, n2.port, n2.user) == ("n2", 22, "bob")
    assert other.known_hosts == (os.path.expanduser("~/.ssh/known_hosts"), "/etc/ssh/ssh_known_hosts")
    (forced,) = resolve_hosts(entries[:1], SSHSpec(user="root", port=22, identity_file="/k", known_hosts="/kh"), config)
    assert (forced.user, forced.port, forced.identity_files, forced.known_hosts) == ("root", 22, ("/k",), ("/kh",))


def test_resolve_hosts_refuses_proxies() -> None:
    """ProxyJump/ProxyCommand would be silently bypassed, so they are an error naming the host."""
    from clusterddp.errors import RemoteError

    with pytest.raises(RemoteError, match="h:9: proxied: ssh_config proxyjump is not supported"):
        resolve_hosts([HostEntry("proxied", None, None, "h:9")], SSHSpec(), paramiko.SSHConfig.from_text(SSH_CONFIG))


def _facts(**changes: object) -> dict[str, object]:
    facts = {"python": "3.11.7", "executable": "/py", "clusterddp": {"version": "0.1.0"}, "torch": "2.14.1",
             "missing": [], "route": {"dev": "eth0"}, "cpus": 2, "gpus": 0}
    facts.update(changes)
    return facts


@pytest.mark.parametrize("changes,problem", [
    ({}, None),
    ({"python": "3.10.1"}, "python 3.10.1 (/py), head has 3.11.7"),
    ({"clusterddp": {"version": None, "error": "ModuleNotFoundError: x"}}, "clusterddp is not importable"),
    ({"clusterddp": {"version": "0.0.9", "file": "/x"}}, "clusterddp 0.0.9 (/x), head has 0.1.0"),
    ({"torch": None}, "torch not installed, head has 2.14.1"),
    ({"torch": "2.1.0"}, "torch 2.1.0, head has 2.14.1"),
    ({"missing": ["/jobs/a.yaml"]}, "/jobs/a.yaml not found"),
    ({"route": {"error": "RTNETLINK answers: Network is unreachable"}}, "no route to the master: RTNETLINK"),
    ({"port_busy": "Address already in use"}, "master port not free: Address already in use"),
    ({"cwd_error": "No such file or directory"}, "working directory missing"),
])
def test_check_host(changes: dict[str, object], problem: str | None) -> None:
    """Each mismatch with the head becomes one problem line for that host."""
    from clusterddp.launch.ssh.hosts import Host

    session = HostSession(host=Host("h", "h", 22, "u", (), (), None, "f:1"), node_rank=0, facts=_facts(**changes))
    check_host(session, HeadFacts(python="3.11.7", clusterddp="0.1.0", torch="2.14.1"), set())
    if problem is None:
        assert session.problems == []
    else:
        assert len(session.problems) == 1 and problem in session.problems[0]


def test_stub_probes_then_execs_keeping_pid_and_stdin(tmp_path: Path) -> None:
    """The stub reports facts, then execve's the argv it is sent: same PID, stdin still attached."""
    stub = Path(__file__).resolve().parents[2] / "clusterddp" / "launch" / "ssh" / "stub.py"
    proc = subprocess.Popen([sys.executable, "-c", stub.read_text()], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    request = {"cwd": str(tmp_path), "env": {"PYTHONPATH": "/nowhere"}, "master_addr": "127.0.0.1",
               "master_port": 1, "check_port": False, "paths": [str(tmp_path), "/no/such/file"]}
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line.startswith(b"CLUSTERDDP_PROBE ")
    facts = json.loads(line.split(b" ", 1)[1])
    assert facts["pid"] == proc.pid and facts["missing"] == ["/no/such/file"]
    assert facts["python"] == sys.version.split()[0] and facts["route"]["dev"] == "lo"
    script = "import os,sys; print(os.getpid(), os.getcwd(), os.environ['V'], sys.stdin.read().strip())"
    go = {"argv": [sys.executable, "-c", script], "env": {"V": "$(id) 'x'"}, "cwd": "/"}
    out, _ = proc.communicate(json.dumps(go).encode() + b"\nafter-go\n", timeout=600)
    assert out.decode().split(" ", 3) == [str(proc.pid), "/", "$(id)", "'x' after-go\n"]


def test_stub_exits_quietly_on_eof() -> None:
    """A stub whose head closes stdin (preflight failed elsewhere) exits 0 and starts nothing."""
    stub = Path(__file__).resolve().parents[2] / "clusterddp" / "launch" / "ssh" / "stub.py"
    done = subprocess.run([sys.executable, "-c", stub.read_text()], input=b"", capture_output=True, timeout=600)
    assert done.returncode == 0 and done.stdout == b""
