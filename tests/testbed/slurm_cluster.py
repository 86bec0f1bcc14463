"""A real SLURM cluster on one machine: slurmctld plus one slurmd per network namespace.

Layout (facts behind it: ../shared/TESTBEDS.md)::

    root namespace: bridge cdslurmbr0 10.79.0.1/24, munged (private socket),
                    slurmctld (own UTS + mount namespace: hostname cdslurmctl)
      ├─ veth cdslurmv1 ── netns cdslurm1: eth0 10.79.0.2/24, slurmd -N cdslurm1
      └─ veth cdslurmv2 ── netns cdslurm2: eth0 10.79.0.3/24, slurmd -N cdslurm2

A requeued job waits the credential lifetime before it may start again (slurm.conf.5,
``cred_expire``, default 120 s) and then for the next periodic scheduling pass
(``sched_interval``, default 60 s); the lab sets 10 s and 1 s so requeue tests take seconds.

Each daemon starts under ``nsenter --net`` + ``unshare --uts --mount`` (not ``ip netns exec``,
which remounts /sys and kills slurmd) with its own hostname and a lab ``/etc/hosts``
bind-mounted, so job steps resolve node names without the system resolver. Everything lives
in one temporary directory; ``sbatch``/``squeue``/``scontrol`` find it through ``SLURM_CONF``
in ``cluster.env``. Nodes share the PID space and the file system (a shared home); "what runs
on node K" is answered by each process's ``/proc/PID/ns/net``.

One cluster at a time per machine: ``slurm_cluster`` holds ``/run/cdslurm.lock`` and first
removes what a crashed earlier cluster may have left (``cdslurm*`` namespaces and the bridge).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from tests.testbed import namespaces
from tests.testbed.namespaces import NETNS_DIR, pids_in_netns
from tests.testbed.patience import patient

PREFIX = "cdslurm"
BRIDGE = namespaces.bridge_name(PREFIX)
SUBNET = "10.79.0"
CONTROLLER_IP = f"{SUBNET}.1"
CONTROLLER_NAME = f"{PREFIX}ctl"
LOCK_FILE = "/run/cdslurm.lock"
#: Seconds a job's leftover process gets between SIGTERM and SIGKILL.
JOB_GRACE = 2.0
#: Seconds a daemon gets between SIGTERM and SIGKILL (slurmctld writes its state on the way out).
DAEMON_GRACE = 3.0
#: CPUs each node claims; above the real count is fine (no cgroups, no binding).
CPUS_PER_NODE = 4

SLURM_CONF = """\
ClusterName={prefix}
SlurmctldHost={ctl_name}({ctl_ip})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmdParameters=config_overrides
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass(frozen=True)
class SlurmNode:
    """One node: a network namespace with an address on the bridge and a slurmd."""

    name: str
    ip: str
    netns: str
    slurmd_pid: int

    def netns_inode(self) -> int:
        return os.stat(f"{NETNS_DIR}/{self.netns}").st_ino


@dataclass
class SlurmCluster:
    """A running cluster and the environment its clients (sbatch, squeue...) need."""

    root: Path
    conf: Path
    nodes: list[SlurmNode]
    env: dict[str, str]
    daemon_pids: list[int]

    def command(self, *argv: str, check: bool = True, timeout: float = 30,
                cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command against this cluster."""
        result = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                                timeout=timeout, cwd=cwd, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, NodeList, Restarts, ...)."""
        out = self.command("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_state(self, job_id: str, states: Sequence[str], timeout: float) -> dict[str, str]:
        """Poll until the job is in one of ``states``; raises with the last state on timeout.

        Polls scontrol instead of ``sbatch --wait``, whose back-off adds tens of seconds.
        """
        timeout = patient(timeout)
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} not in {list(states)} after {timeout}s: {info.get('JobState')} "
                           f"({info.get('Reason')})\n{self.logs_tail()}")

    def node_processes(self, node: SlurmNode) -> list[int]:
        """PIDs in ``node``'s namespace other than its slurmd: what jobs left behind."""
        return [pid for pid in pids_in_netns(node.netns_inode()) if pid != node.slurmd_pid]

    def wait_clean(self, timeout: float) -> dict[str, list[int]]:
        """Poll until no job process is left on any node; returns what is left (empty: clean)."""
        timeout = patient(timeout)
        deadline = time.monotonic() + timeout
        while True:
            left = {n.name: pids for n in self.nodes if (pids := self.node_processes(n))}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def logs_tail(self, lines: int = 15) -> str:
        """The end of every daemon log, for failure messages."""
        parts = []
        for log in sorted(self.root.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)


def unavailable_reason() -> str | None:
    """Why a cluster cannot run here (None when it can): tests skip with this reason."""
    return namespaces.unavailable_reason(
        "needs root (network namespaces, slurmd)",
        ("ip", "nsenter", "unshare", "slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol"),
        tool_hint="apt-get install --no-install-recommends slurmctld slurmd slurm-client munge")


@contextlib.contextmanager
def slurm_cluster(n_nodes: int = 2, base_env: Mapping[str, str] | None = None,
                  workdir: str | os.PathLike[str] | None = None,
                  plugstack: Callable[[Path], Sequence[str]] | None = None) -> Iterator[SlurmCluster]:
    """Bring up munged, slurmctld and ``n_nodes`` slurmd nodes; tear all of it down on exit.

    ``base_env`` is what clients (and so every job, which inherits sbatch's environment) run
    with; ``SLURM_CONF`` is added. Nodes are ``cdslurm1..N`` at ``10.79.0.2..N+1``.
    ``plugstack`` gives the lines of plugstack.conf (SPANK plugins), given the cluster's
    directory: they are written before any slurmd starts, since a plugin may set itself up when
    slurmd loads it (pyxis creates its runtime directory then, and only then).
    """
    if not 1 <= n_nodes <= 50:
        raise ValueError(f"n_nodes must be 1..50, got {n_nodes}")
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"cannot build a SLURM cluster: {reason}")
    pids: list[int] = []
    env = dict(base_env if base_env is not None else os.environ)
    with namespaces.scratch_dir("cdslurm-", workdir) as root, namespaces.exclusive(LOCK_FILE, remove_leftovers):
        try:
            yield _bring_up(n_nodes, root, pids, env, plugstack)
        finally:
            _stop(pids)


def remove_leftovers() -> None:
    """Kill processes inside ``cdslurm*`` namespaces, delete those namespaces, our veths and the bridge."""
    namespaces.remove_leftovers(PREFIX, grace=JOB_GRACE)


def _bring_up(n_nodes: int, root: Path, pids: list[int], base_env: dict[str, str],
              plugstack: Callable[[Path], Sequence[str]] | None) -> SlurmCluster:
    network = namespaces.build_network(PREFIX, SUBNET, n_nodes)
    names, ips = [name for name, _ in network], [ip for _, ip in network]

    etc_hosts = root / "etc_hosts"
    etc_hosts.write_text("127.0.0.1 localhost\n::1 localhost\n" + f"{CONTROLLER_IP} {CONTROLLER_NAME}\n"
                         + "".join(f"{ip} {name}\n" for name, ip in zip(names, ips)))
    munge_socket = _start_munged(root, pids)
    ctld_port, slurmd_port = _free_port(), _free_port()
    for sub in ("state", *(f"spool/{name}" for name in names)):
        (root / sub).mkdir(parents=True)
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(
        prefix=PREFIX, ctl_name=CONTROLLER_NAME, ctl_ip=CONTROLLER_IP, ctld_port=ctld_port,
        slurmd_port=slurmd_port, munge_socket=munge_socket, root=root,
        nodes="\n".join(f"NodeName={n} NodeAddr={ip} CPUs={CPUS_PER_NODE} RealMemory=1000 State=UNKNOWN"
                        for n, ip in zip(names, ips))))
    if plugstack is not None:
        (root / "plugstack.conf").write_text("".join(line + "\n" for line in plugstack(root)))
    env = {k: v for k, v in base_env.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(conf)

    pids.append(_daemon(root / "slurmctld.out", None, CONTROLLER_NAME, etc_hosts,
                        ["slurmctld", "-D", "-c", "-i", "-f", str(conf)], env))
    nodes = []
    for name, ip in zip(names, ips):
        pid = _daemon(root / f"slurmd-{name}.out", name, name, etc_hosts,
                      ["slurmd", "-D", "-N", name, "-f", str(conf)], env)
        pids.append(pid)
        nodes.append(SlurmNode(name=name, ip=ip, netns=name, slurmd_pid=pid))
    cluster = SlurmCluster(root=root, conf=conf, nodes=nodes, env=env, daemon_pids=pids)
    _wait_idle(cluster, names)
    return cluster


def _start_munged(root: Path, pids: list[int]) -> Path:
    """munged on a private socket, with its own key; munged insists on strict modes."""
    key_dir, sock_dir = root / "munge-etc", root / "munge-run"
    key_dir.mkdir(mode=0o700)
    sock_dir.mkdir(mode=0o755)
    os.chmod(root, 0o755)  # munged refuses a socket path under a directory others cannot traverse
    key = key_dir / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    socket_path = sock_dir / "munge.socket"
    with open(root / "munged.out", "wb") as out:
        proc = subprocess.Popen(["munged", "--foreground", "--force", f"--socket={socket_path}",
                                 f"--key-file={key}", f"--pid-file={sock_dir / 'munged.pid'}",
                                 f"--log-file={root / 'munged.log'}", f"--seed-file={key_dir / 'munged.seed'}"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    pids.append(proc.pid)
    deadline = time.monotonic() + 10
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("munged did not start:\n" + (root / "munged.out").read_text(errors="replace"))
        time.sleep(0.02)
    return socket_path


def _daemon(out: Path, netns: str | None, hostname: str, etc_hosts: Path, argv: list[str],
            env: Mapping[str, str]) -> int:
    """Start a daemon with its own hostname and /etc/hosts, in ``netns`` (None: the root one).

    nsenter, unshare and sh all exec, so the returned PID is the daemon itself.
    """
    script = f"hostname {hostname} && mount --bind {etc_hosts} /etc/hosts && exec " + " ".join(argv)
    prefix = ["nsenter", f"--net={NETNS_DIR}/{netns}"] if netns else []
    with open(out, "wb") as log:
        proc = subprocess.Popen([*prefix, "unshare", "--uts", "--mount", "sh", "-c", script],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env))
    return proc.pid


def _wait_idle(cluster: SlurmCluster, names: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        result = cluster.command("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
        states = dict(line.split() for line in result.stdout.splitlines() if len(line.split()) == 2)
        if all(states.get(n) == "idle" for n in names):
            return
        time.sleep(0.1)
    raise RuntimeError(f"SLURM nodes not idle after {timeout}s: {states}\n{cluster.logs_tail()}")


def _stop(pids: list[int]) -> None:
    """Jobs' processes first (they live in the node namespaces), then the daemons by PID."""
    node_names = [n for n in namespaces.netns_names() if n.startswith(PREFIX)]
    namespaces.terminate([p for p in namespaces.pids_in_namespaces(node_names) if p not in pids],
                         grace=JOB_GRACE)
    namespaces.terminate(list(reversed(pids)), grace=DAEMON_GRACE)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
