"""Network namespaces on a bridge: the primitives every test bed on this machine shares.

A test bed (the SSH lab, the SLURM cluster, the OpenPAI nodes) owns a name prefix and a
/24: its bridge is ``{prefix}br0`` at ``{subnet}.1``, its hosts are namespaces
``{prefix}1..N`` whose ``eth0`` sits at ``{subnet}.2..N+1`` behind veths ``{prefix}v1..N``.
Hosts share the PID space, so "what runs on host K" is answered by each process's
``/proc/PID/ns/net``, and cleaning up means ending those processes before the namespaces go.

Each test bed holds its own lock file for its whole life and removes its leftovers on entry
(a crashed run may have left namespaces behind) and on exit: ``exclusive`` does both.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Collection, Iterator, Mapping, Sequence

NETNS_DIR = "/var/run/netns"
#: The interface every host has inside its namespace.
IFNAME = "eth0"


def bridge_name(prefix: str) -> str:
    """The bridge in the root namespace that every host of ``prefix`` hangs off."""
    return f"{prefix}br0"


def veth_name(prefix: str, index: int) -> str:
    """The root-namespace end of host ``index``'s veth: taking it down cuts the host off."""
    return f"{prefix}v{index}"


def unavailable_reason(root_reason: str, tools: Sequence[str], tool_hint: str = "",
                       files: Mapping[str, str] | None = None) -> str | None:
    """Why namespaces cannot be made here (None when they can): tests skip with this reason.

    Checked in order, so the message names the first thing to fix: root (``root_reason`` says
    what for), every tool in ``tools`` on PATH (``tool_hint`` says how to install them), every
    path in ``files`` (mapped to the message when missing), and last whether ``ip netns`` works.
    """
    if os.geteuid() != 0:
        return root_reason
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} not found" + (f" ({tool_hint})" if tool_hint else "")
    for path, message in (files or {}).items():
        if not os.path.exists(path):
            return message
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"ip netns unavailable: {probe.stderr.strip()}"
    return None


@contextlib.contextmanager
def exclusive(lock_file: str, remove_leftovers: Callable[[], None]) -> Iterator[None]:
    """Hold ``lock_file`` (one test bed of a kind per machine, across checkouts) and clean up.

    ``remove_leftovers`` runs once the lock is held, for what a crashed run left behind, and
    again on exit, before the lock is released, so the next holder starts from nothing.
    Python opens files with O_CLOEXEC, so the daemons a test bed starts do not inherit the
    lock and cannot keep it held after the test bed is gone.
    """
    with open(lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove_leftovers()
        try:
            yield
        finally:
            remove_leftovers()


@contextlib.contextmanager
def scratch_dir(prefix: str, parent: str | os.PathLike[str] | None) -> Iterator[Path]:
    """A fresh directory for a test bed's keys, configs and logs, removed with all it holds."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build_network(prefix: str, subnet: str, count: int) -> list[tuple[str, str]]:
    """Create the bridge and ``count`` hosts (see the module docstring); returns (name, ip) pairs.

    The first failing command stops the bring-up and raises; ``remove_leftovers`` clears
    whatever was made before it.
    """
    bridge = bridge_name(prefix)
    hosts = [(f"{prefix}{k}", f"{subnet}.{k + 1}") for k in range(1, count + 1)]
    commands = [f"link add {bridge} type bridge", f"addr add {subnet}.1/24 dev {bridge}",
                f"link set {bridge} up"]
    for k, (name, _) in enumerate(hosts, start=1):
        commands += [f"netns add {name}",
                     f"link add {veth_name(prefix, k)} type veth peer name {IFNAME} netns {name}",
                     f"link set {veth_name(prefix, k)} master {bridge} up"]
    ip_batch(commands)
    for name, address in hosts:
        ip_batch([f"addr add {address}/24 dev {IFNAME}", f"link set {IFNAME} up", "link set lo up"],
                 netns=name)
    return hosts


def remove_leftovers(prefix: str, grace: float) -> None:
    """End processes inside ``prefix*`` namespaces, delete our links, then the namespaces.

    Only test beds start processes in these namespaces, so all of them may be ended; each
    gets SIGTERM and ``grace`` seconds before SIGKILL. Links go explicitly, before the
    namespaces: a deleted namespace's veth ends vanish only when the kernel gets round to
    destroying the namespace, and the next test bed would trip over them.
    """
    names = [n for n in netns_names() if n.startswith(prefix)]
    terminate(pids_in_namespaces(names), grace=grace)
    links = sorted(p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(prefix))
    if links:
        ip_batch([f"link del {name}" for name in links], check=False, force=True)
    if names:
        ip_batch([f"netns del {name}" for name in names], force=True)


def netns_names() -> list[str]:
    """Every named network namespace on the machine (``ip netns list``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in_namespaces(names: Sequence[str]) -> list[int]:
    """PIDs inside any of the named namespaces (a name that vanished meanwhile is skipped)."""
    inodes = set()
    for name in names:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"{NETNS_DIR}/{name}").st_ino)
    return _pids_in(inodes) if inodes else []


def pids_in_netns(inode: int) -> list[int]:
    """PIDs whose network namespace is the one with this nsfs inode."""
    return _pids_in({inode})


def _pids_in(inodes: Collection[int]) -> list[int]:
    """One pass over /proc: the PIDs whose network namespace inode is in ``inodes``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino in inodes:
                found.append(int(entry.name))
        except OSError:  # exited meanwhile, or a kernel thread
            continue
    return found


def terminate(pids: Sequence[int], grace: float = 2.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` to those still alive; returns once they are gone.

    Only the survivors get SIGKILL (a PID that exited may already belong to someone else),
    and SIGKILL is not instant either, so up to ``grace`` more is spent waiting for them.
    Our own children are reaped, so none is left a zombie.
    """
    _signal(pids, signal.SIGTERM)
    survivors = _wait_gone(pids, grace)
    _signal(survivors, signal.SIGKILL)
    _wait_gone(survivors, grace)
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs; reaps it when it is our child and has exited."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return not exited(pid)


def exited(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie, without reaping it (its PID stays reserved)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def ip(*args: str, check: bool = True) -> None:
    """One ``ip`` command; raises with its stderr when it fails and ``check`` is set."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def ip_batch(commands: Sequence[str], netns: str | None = None, check: bool = True,
             force: bool = False) -> None:
    """Many ``ip`` commands in one process (inside ``netns`` if given).

    ``force`` carries on past a failing command (teardown: delete all that can be deleted);
    without it the first failure stops the batch. Either way ``check`` raises on any failure.
    """
    argv = ["ip", *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"]
    proc = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    """Poll until every PID has exited or ``timeout`` passes; returns the ones still alive."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left
