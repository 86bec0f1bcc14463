"""Reaching a host: one SSH connection to it, the stub started there and its facts read, every
host checked together (preflight), and what the head will tell each stub to run.

Connections are opened the way a long job needs them:

- The TCP socket is ours (``connect(sock=...)``) so it carries keepalive (idle 2 s, interval
  2 s, 3 probes) and ``TCP_USER_TIMEOUT``: paramiko's own keepalive never notices a cut link,
  and while the head sends keepalives the connection is never idle, so only the user timeout
  (the head's data unacknowledged for ``ssh.link_timeout``, 1 s by default) catches a cable
  pulled mid-run. The kernel's timer, not an answer the host's processes must give: a head or
  a host starved of CPU still acknowledges in the kernel, so only a link that is really gone
  (or a network dropping everything for that long) counts as lost.
- Host keys are checked against known_hosts. RejectPolicy by default; ``accept_new_host_keys``
  is OpenSSH's ``accept-new``: an unknown key is added to the first known_hosts file, a key
  that changed is always refused.
- Every failure becomes one line that names the host and says what to do.

What each host runs is built from parts and never by pasting strings together. Only two
strings ever reach a remote shell, both built here with ``shlex.quote``: the stub's start
(``exec PYTHON -c SOURCE``) and the fallback kill (digits only). The launcher's argv and env
(``attempt.launcher_argv``, ``attempt.launcher_env``) travel to the stub as JSON in a
``LaunchPlan`` and go into ``execve`` untouched, so no value from the job file or the command
line can be read as shell syntax. ``LaunchPlan.shell_line`` renders the same launch as one
copy-pasteable shell line for ``--dry-run`` and for starting a node by hand.

Preflight: connect to every host in parallel, start the stub, and check all hosts before
starting any. Every host is tried and every problem collected, so one run of ``clusterddp
run`` tells the user about all broken hosts at once (Fabric's GroupException, not a stop at
the first). Nothing is started anywhere unless every host passes: a failing preflight closes
each stub's stdin and the stubs exit without running anything.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import paramiko

from clusterddp import __version__
from clusterddp.atomicfile import append_whole
from clusterddp.codetree.transfer import STORE_SOURCE, CodePlan, ShipError, ship, shipped_path
from clusterddp.errors import RemoteError
from clusterddp.launch.ssh.hosts import Host
from clusterddp.launch.ssh.stub import PROBE_MARKER as PROBE_LINE

# paramiko logs a failed handshake from its transport thread, traceback included, through
# Python's last-resort handler; we already turn every failure into one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

KEEPALIVE_IDLE = 2
KEEPALIVE_INTERVAL = 2
KEEPALIVE_PROBES = 3
#: ``ssh.link_timeout``'s default (sections/ssh.py), for settings and sessions built in code.
LINK_TIMEOUT = 1.0

_known_hosts_lock = threading.Lock()


class ConnectError(Exception):
    """A host could not be reached or authenticated; ``str()`` is the one line to show."""

    def __init__(self, host: Host, message: str, hint: str | None = None) -> None:
        super().__init__(f"{message} (hint: {hint})" if hint else message)
        self.host = host


@dataclass(frozen=True)
class ConnectSettings:
    timeout: float = 10.0
    accept_new_host_keys: bool = False
    #: Seconds of unacknowledged data before a connection counts as lost (``ssh.link_timeout``).
    link_timeout: float = LINK_TIMEOUT

    @property
    def policy_name(self) -> str:
        """The host-key policy in force, as logged at the start of a run."""
        if self.accept_new_host_keys:
            return "accept-new (unknown host keys are added to known_hosts; changed keys are refused)"
        return "reject (hosts must already be in known_hosts)"


class UnknownHostKey(paramiko.SSHException):
    """Raised by the reject policy with the fingerprint, so the user can verify and add it."""

    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key


class _RejectPolicy(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Add an unknown key to the first known_hosts file (created if missing)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _known_hosts_lock:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o700, exist_ok=True)
            append_whole(self.path, line)  # a full disk must not leave half a key line


def open_client(host: Host, settings: ConnectSettings) -> paramiko.SSHClient:
    """A connected, authenticated client for ``host``; raises ConnectError with one clear line."""
    sock = open_socket(host, settings)
    client = paramiko.SSHClient()
    try:
        for path in host.known_hosts:
            if os.path.exists(path):
                client.load_host_keys(path)
        policy: paramiko.MissingHostKeyPolicy = (
            _AcceptNewPolicy(host.known_hosts[0]) if settings.accept_new_host_keys else _RejectPolicy())
        client.set_missing_host_key_policy(policy)
        client.connect(
            host.address, port=host.port, username=host.user, sock=sock,
            key_filename=list(host.identity_files) or None,  # type: ignore[arg-type]  # a list works too
            look_for_keys=not host.identity_files,
            allow_agent=bool(os.environ.get("SSH_AUTH_SOCK")),
            timeout=settings.timeout, banner_timeout=settings.timeout, auth_timeout=settings.timeout)
    except Exception as exc:
        client.close()
        sock.close()
        raise _explain(host, exc) from None
    return client


def user_timeout_ms(link_timeout: float) -> int:
    """``TCP_USER_TIMEOUT`` for a link timeout in seconds: whole milliseconds, as the kernel takes it."""
    return max(1, round(link_timeout * 1000))


def open_socket(host: Host, settings: ConnectSettings) -> socket.socket:
    """The TCP connection to ``host``, made here rather than by paramiko so that it carries
    keepalive and ``TCP_USER_TIMEOUT`` (``settings.link_timeout``); raises ConnectError."""
    try:
        infos = socket.getaddrinfo(host.address, host.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConnectError(host, f"cannot resolve {host.address}: {exc.strerror}",
                           "check the name, or give HostName in the ssh config") from None
    last: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, user_timeout_ms(settings.link_timeout))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(settings.timeout)
        try:
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    assert last is not None  # getaddrinfo returns at least one address or raises
    raise _explain(host, last)


def _explain(host: Host, exc: BaseException) -> ConnectError:
    """One line per failure kind, naming the host; the hint says what the user can do."""
    where = f"{host.address}:{host.port}"
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, UnknownHostKey):
        files = ", ".join(host.known_hosts)
        fingerprint = exc.key.fingerprint if hasattr(exc.key, "fingerprint") else exc.key.get_base64()[:20]
        return ConnectError(host, f"host key refused: {exc.hostname} is not in known_hosts ({files}); "
                                  f"it offered {exc.key.get_name()} {fingerprint}",
                            f"verify the fingerprint, then 'ssh-keyscan -p {host.port} {host.address} >> "
                            f"{host.known_hosts[0]}', or set ssh.accept_new_host_keys: true")
    if isinstance(exc, paramiko.BadHostKeyException):
        return ConnectError(host, f"HOST KEY CHANGED for {exc.hostname}: it offered {exc.key.get_name()} "
                                  f"{exc.key.fingerprint}, known_hosts has {exc.expected_key.fingerprint}; "
                                  "refusing to connect (possible man-in-the-middle)",
                            f"if the host was reinstalled, remove its line from {host.known_hosts[0]}")
    if isinstance(exc, paramiko.AuthenticationException):
        keys = ", ".join(host.identity_files) or "~/.ssh/id_* and the agent"
        return ConnectError(host, f"authentication failed as {host.user} at {where} (keys tried: {keys})",
                            "check ssh.user / ssh.identity_file or the ssh config's User / IdentityFile")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ConnectError(host, f"no answer from {where} within the connect timeout",
                            "is the host up and reachable from the head?")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) or isinstance(exc, ConnectionRefusedError):
        return ConnectError(host, f"connection refused at {where}", "is sshd running on that host and port?")
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return ConnectError(host, f"{where} unreachable: {exc.strerror}", "check the address and the network")
    if isinstance(exc, (paramiko.SSHException, EOFError, OSError)):
        return ConnectError(host, f"ssh to {where} failed: {exc or type(exc).__name__}")
    raise exc


STUB_SOURCE = (Path(__file__).with_name("stub.py")).read_text(encoding="utf-8")


@dataclass(frozen=True)
class LaunchPlan:
    """One host's launcher: exactly what the stub will ``execve``."""

    host: str
    node_rank: int
    nproc: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    #: ``env_passthrough`` names among ``env``: secrets, shown by ``shell_line`` as ``"$NAME"``.
    passthrough: tuple[str, ...] = ()

    def message(self) -> dict[str, object]:
        """The JSON 'go' message for the stub."""
        return {"argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd}

    def shell_line(self) -> str:
        """The same launch as one shell line (dry run; starting one node by hand). A passthrough
        variable appears as a reference to the caller's own (``NAME="$NAME"``), never its value."""
        exports = " ".join(f'{k}="${k}"' if k in self.passthrough else f"{k}={shlex.quote(v)}"
                           for k, v in sorted(self.env.items()))
        command = " ".join(shlex.quote(a) for a in self.argv)
        return f"cd {shlex.quote(self.cwd)} && " + (f"env {exports} " if exports else "") + command


def stub_command(python: str) -> str:
    """The remote command that starts the stub (the login shell execs into the interpreter)."""
    return f"exec {shlex.quote(python)} -c {shlex.quote(STUB_SOURCE)}"


def kill_command(pid: int, pgid: int, signal_name: str) -> str:
    """Signal the launcher's process group (or only the launcher when it leads no group)."""
    if signal_name not in ("TERM", "KILL"):
        raise ValueError(f"unexpected signal {signal_name!r}")
    target = f"-- -{int(pgid)}" if int(pgid) == int(pid) else str(int(pid))
    return f"kill -{signal_name} {target} 2>/dev/null; true"


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
    #: Its socket's link timeout (``ConnectSettings.link_timeout``): how long a lost link went unnoticed.
    link_timeout: float = LINK_TIMEOUT
    client: paramiko.SSHClient | None = None
    channel: paramiko.Channel | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: Output that arrived before the probe line (a chatty .bashrc); shown when things fail.
    noise: bytes = b""
    seconds: float = 0.0
    #: The node rank its launcher started with, once a restart in place numbered the hosts
    #: again (None: never): that launcher's event log keeps its first name for its life.
    launched_as: int | None = None
    #: Where the shipped code tree is on this host (``code:``), and the file bytes sent to it.
    code_root: str | None = None
    code_sent: int = 0

    def remote_path(self, head_path: str, code: CodePlan | None) -> str:
        """A head path as this host sees it: in its shipped tree when the path is in the
        head's, else unchanged (a shared filesystem)."""
        if code is None or self.code_root is None:
            return head_path
        return shipped_path(head_path, code.tree.root, self.code_root)

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
                   probe_timeout: float, code: CodePlan | None = None) -> list[HostSession]:
    """Connect, ship the code tree (``code``) and start the stub and read its probe on every
    host at once (never raises); a host whose tree does not check has that as its problem,
    and no stub."""
    sessions = [HostSession(host=h, node_rank=i, link_timeout=settings.link_timeout) for i, h in enumerate(hosts)]

    def one(session: HostSession) -> None:
        start = time.monotonic()
        try:
            _start(session, settings, python, request_for(session.node_rank, session.host), probe_timeout, code)
        except ConnectError as exc:
            session.problems.append(str(exc))
        except ShipError as exc:
            session.problems.append(str(exc))
        except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
            session.problems.append(f"ssh session failed: {str(exc) or type(exc).__name__}")
        session.seconds = time.monotonic() - start

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(sessions))), thread_name_prefix="ssh") as pool:
        list(pool.map(one, sessions))
    return sessions


def _start(session: HostSession, settings: ConnectSettings, python: str, request: Mapping[str, Any],
           timeout: float, code: CodePlan | None = None) -> None:
    session.client = open_client(session.host, settings)
    if code is not None:
        ship_code(session, code, python, timeout)
        request = {**request, "cwd": session.remote_path(request["cwd"], code),
                   "paths": [session.remote_path(p, code) for p in request["paths"]]}
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


def ship_code(session: HostSession, code: CodePlan, python: str, timeout: float) -> None:
    """The code tree into the host's cache over a channel of its connection (a stream to
    ``codetree.store``: two round trips whatever the tree, see there why not SFTP); the tree
    is used only when the host answers with its hash (``ShipError`` otherwise: one line)."""
    assert session.client is not None
    channel = session.client.get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
    channel.settimeout(timeout)
    try:
        channel.exec_command(f"exec {shlex.quote(python)} -c {shlex.quote(STORE_SOURCE)}")
        shipped = ship(channel, code.tree, code.cache)
    except socket.timeout:
        raise ShipError(f"code tree: no answer from the host's cache within {timeout:.0f}s") from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        why = str(exc) or type(exc).__name__
        raise ShipError(f"code tree: connection lost during the transfer ({why}); the host keeps no tree "
                        "from it") from None
    finally:
        try:
            channel.close()
        except (paramiko.SSHException, OSError, EOFError):
            pass  # a lost link: what the transfer met (or not) is said above
    session.code_root, session.code_sent = shipped.path, shipped.sent


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
