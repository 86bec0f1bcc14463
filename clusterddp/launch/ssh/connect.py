"""One SSH connection per host, opened the way a long job needs them.

- The TCP socket is ours (``connect(sock=...)``) so it carries keepalive (idle 2 s, interval
  2 s, 3 probes) and ``TCP_USER_TIMEOUT``: paramiko's own keepalive never notices a cut link,
  and while the head sends heartbeats the connection is never idle, so only the user timeout
  (unacknowledged data for 5 s) catches a cable pulled mid-run.
- Host keys are checked against known_hosts. RejectPolicy by default; ``accept_new_host_keys``
  is OpenSSH's ``accept-new``: an unknown key is added to the first known_hosts file, a key
  that changed is always refused.
- Every failure becomes one line that names the host and says what to do.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
from dataclasses import dataclass

import paramiko

from clusterddp.atomicfile import append_whole
from clusterddp.launch.ssh.hosts import Host

# paramiko logs a failed handshake from its transport thread, traceback included, through
# Python's last-resort handler; we already turn every failure into one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

KEEPALIVE_IDLE = 2
KEEPALIVE_INTERVAL = 2
KEEPALIVE_PROBES = 3
#: Milliseconds of unacknowledged data before the kernel drops the connection.
USER_TIMEOUT_MS = 5000

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
    sock = _keepalive_socket(host, settings.timeout)
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


def _keepalive_socket(host: Host, timeout: float) -> socket.socket:
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
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)
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
