"""Connect to every host in parallel, start the stub, and check all hosts before starting any.

Every host is tried and every problem collected, so one run of ``clusterddp run`` tells the
user about all broken hosts at once (Fabric's GroupException, not a stop at the first).
Nothing is started anywhere unless every host passes: a failing preflight closes each
stub's stdin and the stubs exit without running anything.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import paramiko

from clusterddp import __version__
from clusterddp.errors import RemoteError
from clusterddp.launch.ssh.connect import ConnectError, ConnectSettings, open_client
from clusterddp.launch.ssh.hosts import Host
from clusterddp.launch.ssh.remote_command import stub_command
from clusterddp.launch.ssh.stub import PROBE_MARKER as PROBE_LINE

PROBE_MARKER = PROBE_LINE.encode()
#: Exit status of a login shell that could not find the command (the interpreter path).
NOT_FOUND = 127


class PreflightError(RemoteError):
    """One or more hosts failed preflight; ``problems`` maps each host to its problems."""

    def __init__(self, problems: dict[str, list[str]], total: int, cluster: Sequence[str] = ()) -> None:
        head = (f"preflight failed on {len(problems)} of {total} hosts; nothing was started:"
                if problems else "preflight failed; nothing was started:")
        lines = [f"{host}: {m}" for host, messages in problems.items() for m in messages]
        lines.extend(f"all hosts: {m}" for m in cluster)
        super().__init__(head, details=lines)
        self.problems = problems
        self.cluster = list(cluster)


@dataclass
class HostSession:
    """One host from connection to the end of the run."""

    host: Host
    node_rank: int
    client: paramiko.SSHClient | None = None
    channel: paramiko.Channel | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: Output that arrived before the probe line (a chatty .bashrc); shown when things fail.
    noise: bytes = b""
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.host.name} ({self.host.origin}, {self.host.target})"

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


@dataclass(frozen=True)
class HeadFacts:
    """What the hosts are compared with: this (head) machine's versions."""

    python: str
    clusterddp: str
    torch: str | None

    @staticmethod
    def here() -> "HeadFacts":
        """Read without importing torch (the launcher never does)."""
        from importlib import metadata

        try:
            torch: str | None = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch = None
        return HeadFacts(python=sys.version.split()[0], clusterddp=__version__, torch=torch)


def start_sessions(hosts: Sequence[Host], settings: ConnectSettings, python: str,
                   request_for: Callable[[int, Host], Mapping[str, Any]], parallel: int,
                   probe_timeout: float) -> list[HostSession]:
    """Connect, start the stub and read its probe on every host at once (never raises)."""
    sessions = [HostSession(host=h, node_rank=i) for i, h in enumerate(hosts)]

    def one(session: HostSession) -> None:
        start = time.monotonic()
        try:
            _start(session, settings, python, request_for(session.node_rank, session.host), probe_timeout)
        except ConnectError as exc:
            session.problems.append(str(exc))
        except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
            session.problems.append(f"ssh session failed: {exc or type(exc).__name__}")
        session.seconds = time.monotonic() - start

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(sessions))), thread_name_prefix="ssh") as pool:
        list(pool.map(one, sessions))
    return sessions


def _start(session: HostSession, settings: ConnectSettings, python: str, request: Mapping[str, Any],
           timeout: float) -> None:
    session.client = open_client(session.host, settings)
    channel = session.client.get_transport().open_session()  # type: ignore[union-attr]
    session.channel = channel
    channel.settimeout(timeout)
    channel.exec_command(stub_command(python))
    channel.sendall(json.dumps(request).encode() + b"\n")
    buffer = b""
    deadline = time.monotonic() + timeout
    while PROBE_MARKER not in buffer or not buffer[buffer.index(PROBE_MARKER):].count(b"\n"):
        if time.monotonic() > deadline:
            session.problems.append(f"no answer from the interpreter within {timeout:.0f}s")
            return
        try:
            chunk = channel.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            session.noise = buffer
            session.problems.append(_stub_died(channel, python, buffer))
            return
        buffer += chunk
    before, _, rest = buffer.partition(PROBE_MARKER)
    line, _, after = rest.partition(b"\n")
    session.noise = before
    session.facts = json.loads(line)
    channel.settimeout(None)


def _stub_died(channel: paramiko.Channel, python: str, stdout: bytes) -> str:
    status = channel.recv_exit_status()
    errors = b""
    while channel.recv_stderr_ready():
        errors += channel.recv_stderr(65536)
    last = (errors or stdout).decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
    if status == NOT_FOUND:
        return f"interpreter {python} not found (exit {status}): {last[0]}"
    return f"the remote interpreter {python} exited with {status} before reporting: {last[0]}"


def check_host(session: HostSession, head: HeadFacts, torch_versions: set[str | None]) -> None:
    """Compare one host's facts with the head's; append a problem per mismatch."""
    facts = session.facts
    if not facts:
        return
    problems = session.problems
    if facts["python"] != head.python:
        problems.append(f"python {facts['python']} ({facts['executable']}), head has {head.python}")
    found = facts["clusterddp"]
    if found.get("version") is None:
        problems.append(f"clusterddp is not importable by {facts['executable']}: {found.get('error')}"
                        " (hint: install it there, or run from a shared checkout)")
    elif found["version"] != head.clusterddp:
        problems.append(f"clusterddp {found['version']} ({found.get('file')}), head has {head.clusterddp}")
    if head.torch is not None and facts["torch"] != head.torch:
        problems.append(f"torch {facts['torch'] or 'not installed'}, head has {head.torch}")
    elif head.torch is None and facts["torch"] is None:
        problems.append("torch is not installed")
    if facts.get("cwd_error"):
        problems.append(f"working directory missing: {facts['cwd_error']} (hint: a shared filesystem, or "
                        "the same paths on every host)")
    for path in facts["missing"]:
        problems.append(f"{path} not found (hint: the job's files must be at the same path on every host)")
    route = facts.get("route")
    if route is not None and route.get("error"):
        problems.append(f"no route to the master: {route['error']}")
    if facts.get("port_busy"):
        problems.append(f"master port not free: {facts['port_busy']} (hint: --master-port or master.port)")
    torch_versions.add(facts["torch"])


def check_all(sessions: Sequence[HostSession], head: HeadFacts) -> None:
    """Check every host; raise one PreflightError listing every host's problems."""
    raise_problems(sessions, check_hosts(sessions, head))


def check_hosts(sessions: Sequence[HostSession], head: HeadFacts) -> list[str]:
    """Check every host, each host's problems into its session; return the problems of the
    hosts together (they cannot be solved by leaving one host out)."""
    torch_versions: set[str | None] = set()
    for session in sessions:
        check_host(session, head, torch_versions)
    cluster = []
    if head.torch is None and len(torch_versions - {None}) > 1:
        cluster.append("hosts have different torch versions: " + ", ".join(sorted(v for v in torch_versions if v)))
    return cluster


def raise_problems(sessions: Sequence[HostSession], cluster: Sequence[str] = ()) -> None:
    problems = {s.label: s.problems for s in sessions if s.problems}
    if problems or cluster:
        raise PreflightError(problems, len(sessions), cluster)
