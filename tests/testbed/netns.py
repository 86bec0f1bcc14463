"""An SSH cluster on one machine: one network namespace and one real sshd per "host".

Layout (see ../shared/TESTBEDS.md for the measured facts behind it)::

    root namespace: bridge cdsshbr0 10.78.0.1/24
      ├─ veth cdsshv1 ── netns cdssh1: eth0 10.78.0.2/24, sshd on 10.78.0.2:22, hostname cdssh1
      ├─ veth cdsshv2 ── netns cdssh2: eth0 10.78.0.3/24, ...
      ...

Each sshd has its own host key; one generated client key is authorised everywhere; a
generated ``ssh_config`` maps host names to addresses (names are never resolved through
the system resolver) and a ``known_hosts`` file lists every host key, so paramiko and
OpenSSH both run with strict host-key checking. Hosts share the PID space and the
filesystem, like nodes with a shared NFS home; "what runs on host K" is answered by each
process's ``/proc/PID/ns/net``. ``ssh_lab(n, private=[DIR, ...])`` takes that sharing away
for those directories: each host's sshd (and so everything a login starts) runs in its own
mount namespace already, and there an empty tmpfs is mounted over each DIR, so a host sees
neither the head's files there nor another host's (a cluster without a shared filesystem).

One lab at a time per machine: ``ssh_lab`` holds an exclusive lock on ``/run/cdssh.lock``
for its whole life, and first removes what a crashed earlier lab may have left (namespaces
named ``cdssh*``, the bridge, processes inside those namespaces, which only labs start).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

from tests.testbed import namespaces
from tests.testbed.namespaces import NETNS_DIR, pids_in_netns
from tests.testbed.patience import patient

PREFIX = "cdssh"
BRIDGE = namespaces.bridge_name(PREFIX)
SUBNET = "10.78.0"
BRIDGE_IP = f"{SUBNET}.1"
LOCK_FILE = "/run/cdssh.lock"
SSHD = "/usr/sbin/sshd"
MAX_HOSTS = 200
#: Seconds a leftover process gets between SIGTERM and SIGKILL.
LEFTOVER_GRACE = 1.0

SSHD_CONFIG = """\
ListenAddress {ip}
Port 22
HostKey {host_key}
PidFile {pidfile}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 200:30:400
MaxSessions 20
ClientAliveInterval 5
ClientAliveCountMax 3
LogLevel ERROR
"""


@dataclass(frozen=True)
class LabHost:
    """One "host": a network namespace with an address on the bridge and an sshd."""

    name: str
    ip: str
    netns: str
    #: The root-namespace end of the host's veth: ``ip link set <veth> down`` cuts the host off.
    veth: str
    sshd_pid: int

    @property
    def netns_path(self) -> str:
        return f"{NETNS_DIR}/{self.netns}"

    def netns_inode(self) -> int:
        return os.stat(self.netns_path).st_ino


@dataclass
class SSHLab:
    """A running lab: hosts, and the files a client needs to reach them strictly."""

    root: Path
    hosts: list[LabHost]
    ssh_config: Path
    known_hosts: Path
    client_key: Path
    hostfile: Path
    _cut: set[str] = field(default_factory=set)
    #: Directories each host sees as its own empty tmpfs (``ssh_lab(private=...)``).
    private: tuple[str, ...] = ()

    def host(self, name_or_index: str | int) -> LabHost:
        """A host by name (``cdssh3``) or by 0-based index."""
        if isinstance(name_or_index, int):
            return self.hosts[name_or_index]
        for host in self.hosts:
            if host.name == name_or_index:
                return host
        raise KeyError(name_or_index)

    def processes(self, host: LabHost, include_sshd: bool = False) -> list[int]:
        """PIDs of processes running in ``host``'s namespace (sshd excluded unless asked).

        sshd is the host's daemon, not part of any job: its per-connection children may
        outlive a cut link until ClientAlive gives up, and are not what tests ask about.
        """
        return [pid for pid in pids_in_netns(host.netns_inode())
                if include_sshd or not _is_sshd(pid)]

    def job_processes(self) -> dict[str, list[int]]:
        """Every host's non-sshd processes; empty lists everywhere means "nothing left"."""
        return {h.name: self.processes(h) for h in self.hosts}

    def wait_clean(self, timeout: float) -> tuple[bool, float, dict[str, list[int]]]:
        """Poll until no job process is left on any host; returns (clean, seconds, leftovers)."""
        timeout = patient(timeout)
        start = time.monotonic()
        while True:
            left = {k: v for k, v in self.job_processes().items() if v}
            elapsed = time.monotonic() - start
            if not left or elapsed > timeout:
                return not left, elapsed, left
            time.sleep(0.05)

    def cut(self, host: LabHost) -> None:
        """Take the host's link down, as if its cable were pulled."""
        namespaces.ip("link", "set", host.veth, "down")
        self._cut.add(host.name)

    def restore(self, host: LabHost) -> None:
        namespaces.ip("link", "set", host.veth, "up")
        self._cut.discard(host.name)

    def run_in(self, host: LabHost, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess:
        """Run a command inside a host's network namespace (no ssh involved)."""
        return subprocess.run(["nsenter", f"--net={host.netns_path}", *argv], **kwargs)  # type: ignore[call-overload]

    def stop_sshd(self, host: LabHost) -> None:
        """Stop one host's sshd (the namespace stays): the host becomes unreachable by ssh."""
        namespaces.terminate([host.sshd_pid])

    def restart_sshd(self, host: LabHost) -> LabHost:
        """Start ``host``'s sshd again, as the lab first started it; returns the host with its new
        ``sshd_pid``, which also takes the old one's place in ``hosts``.

        For a host whose sshd was stopped (``stop_sshd``) or killed with everything else in the
        host (a dead host): the old sshd, if it still runs, is stopped first. Waits until the
        new one answers, so a cut host must be ``restore``d first. The lab's teardown ends it
        like any process left in a host.
        """
        if host.name in self._cut:
            raise RuntimeError(f"{host.name}'s link is cut: restore() it before restarting its sshd")
        index = [h.name for h in self.hosts].index(host.name)
        old = self.hosts[index].sshd_pid
        if old in self.processes(host, include_sshd=True):  # still running, and not a PID reused elsewhere
            namespaces.terminate([old])
        restarted = replace(host, sshd_pid=_start_sshd(self.root, host.name, self.private))
        self.hosts[index] = restarted
        _wait_listening([restarted], self.root / "hosts")
        return restarted

    def write_ssh_config(self, path: Path, hosts: Sequence[LabHost], **options: str) -> Path:
        """An ssh_config for ``hosts`` with extra options for every host (e.g. a wrong key file)."""
        path.write_text("".join(_ssh_config_block(h, self, options) for h in hosts))
        return path


def lab_unavailable_reason() -> str | None:
    """Why a lab cannot run here (None when it can): tests skip with this reason."""
    return namespaces.unavailable_reason(
        "needs root (network namespaces, sshd)", ("ip", "nsenter", "unshare", "ssh-keygen"),
        files={SSHD: f"{SSHD} not found (apt-get install openssh-server)"})


@contextlib.contextmanager
def ssh_lab(n_hosts: int, workdir: str | os.PathLike[str] | None = None,
            private: Sequence[str] = ()) -> Iterator[SSHLab]:
    """Bring up ``n_hosts`` sshd hosts on a bridge; tear everything down on exit.

    Hosts are ``cdssh1..N`` at ``10.78.0.2..N+1``; the head (this process, in the root
    namespace) is ``10.78.0.1``. ``lab.hostfile`` lists the host names, one per line.
    ``private``: existing directories each host sees as its own empty tmpfs (module docstring).
    """
    if not 1 <= n_hosts <= MAX_HOSTS:
        raise ValueError(f"n_hosts must be 1..{MAX_HOSTS}, got {n_hosts}")
    reason = lab_unavailable_reason()
    if reason:
        raise RuntimeError(f"cannot build an SSH lab: {reason}")
    sshd_pids: list[int] = []
    with namespaces.scratch_dir("cdssh-lab-", workdir) as root, namespaces.exclusive(LOCK_FILE, remove_leftovers):
        try:
            yield _bring_up(n_hosts, root, sshd_pids, tuple(os.path.abspath(p) for p in private))
        finally:
            # Only the ones still in a host: a test or benchmark that killed a host's sshd left
            # its PID free for any process on the machine (and a restarted sshd is a leftover).
            in_hosts = set(namespaces.pids_in_namespaces([n for n in namespaces.netns_names() if n.startswith(PREFIX)]))
            namespaces.terminate([pid for pid in sshd_pids if pid in in_hosts])


def remove_leftovers() -> None:
    """Kill processes inside ``cdssh*`` namespaces, delete those namespaces, our veths and the bridge."""
    namespaces.remove_leftovers(PREFIX, grace=LEFTOVER_GRACE)


def _bring_up(n_hosts: int, root: Path, sshd_pids: list[int], private: tuple[str, ...] = ()) -> SSHLab:
    hosts_dir = root / "hosts"
    hosts_dir.mkdir()
    client_key = root / "client_key"
    _keygen(client_key)
    authorized = root / "authorized_keys"
    authorized.write_text(Path(f"{client_key}.pub").read_text())
    network = namespaces.build_network(PREFIX, SUBNET, n_hosts)
    names, ips = [name for name, _ in network], [ip for _, ip in network]
    etc_hosts = root / "etc_hosts"
    etc_hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {n}\n" for n, ip in zip(names, ips)))

    os.makedirs("/run/sshd", exist_ok=True)
    key_jobs = []
    for name in names:
        host_dir = hosts_dir / name
        host_dir.mkdir()
        key_jobs.append(subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                                          "-f", str(host_dir / "ssh_host_ed25519_key")]))
    for job in key_jobs:
        if job.wait() != 0:
            raise RuntimeError("ssh-keygen failed")

    hosts: list[LabHost] = []
    for k, (name, ip) in enumerate(zip(names, ips), start=1):
        host_dir = hosts_dir / name
        (host_dir / "sshd_config").write_text(SSHD_CONFIG.format(
            ip=ip, host_key=host_dir / "ssh_host_ed25519_key", pidfile=host_dir / "sshd.pid",
            authorized_keys=authorized))
        pid = _start_sshd(root, name, private)
        sshd_pids.append(pid)
        hosts.append(LabHost(name=name, ip=ip, netns=name, veth=namespaces.veth_name(PREFIX, k), sshd_pid=pid))

    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join(
        f"{h.name},{h.ip} {_public_key(hosts_dir / h.name / 'ssh_host_ed25519_key.pub')}\n" for h in hosts))
    lab = SSHLab(root=root, hosts=hosts, ssh_config=root / "ssh_config", known_hosts=known_hosts,
                 client_key=client_key, hostfile=root / "hostfile", private=private)
    lab.write_ssh_config(lab.ssh_config, hosts)
    lab.hostfile.write_text("".join(f"{h.name}\n" for h in hosts))
    _wait_listening(hosts, hosts_dir)
    return lab


def _start_sshd(root: Path, name: str, private: Sequence[str] = ()) -> int:
    """Start host ``name``'s sshd from its files under ``root``; returns its PID (not waited for).

    It runs in its own UTS and mount namespaces: the hostname is the host's name and
    /etc/hosts the lab's, so a host resolves every other host by name, as on a cluster; each
    ``private`` directory is a tmpfs of its own there (``unshare --mount`` makes the new
    namespace's mounts private: nothing mounted there propagates back).
    """
    host_dir = root / "hosts" / name
    hide = "".join(f"mount -t tmpfs -o size=512m,mode=0755 cdship {shlex.quote(p)} && " for p in private)
    script = (f"hostname {name} && mount --bind {root / 'etc_hosts'} /etc/hosts && {hide}"
              f"exec {SSHD} -D -e -f {host_dir / 'sshd_config'}")
    with open(host_dir / "sshd.log", "ab") as log:
        proc = subprocess.Popen(["nsenter", f"--net={NETNS_DIR}/{name}", "unshare", "--uts", "--mount",
                                 "sh", "-c", script], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    return proc.pid  # nsenter, unshare and sh all exec: this PID becomes sshd


def _ssh_config_block(host: LabHost, lab: SSHLab, options: dict[str, str]) -> str:
    settings = {"HostName": host.ip, "User": "root", "Port": "22", "IdentityFile": str(lab.client_key),
                "UserKnownHostsFile": str(lab.known_hosts), "StrictHostKeyChecking": "yes",
                "BatchMode": "yes", **options}
    return f"Host {host.name}\n" + "".join(f"  {k} {v}\n" for k, v in settings.items())


def _wait_listening(hosts: list[LabHost], hosts_dir: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    while pending:
        for host in list(pending):
            if namespaces.exited(host.sshd_pid):
                log = (hosts_dir / host.name / "sshd.log").read_text(errors="replace").strip()
                raise RuntimeError(f"sshd on {host.name} exited: {log}")
            with contextlib.suppress(OSError), socket.create_connection((host.ip, 22), timeout=0.5) as sock:
                sock.recv(1)  # wait for the banner: sshd has finished starting
                pending.remove(host)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"sshd not listening after {timeout}s on {[h.name for h in pending]}")
        if pending:
            time.sleep(0.05)


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cdssh-client", "-f", str(path)],
                   check=True)


def _public_key(path: Path) -> str:
    kind, data = path.read_text().split()[:2]
    return f"{kind} {data}"


def _is_sshd(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == SSHD
    except OSError:
        return False
