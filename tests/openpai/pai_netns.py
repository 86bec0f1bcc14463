"""OpenPAI task "nodes" on one machine: network namespaces on a bridge, nothing else.

OpenPAI pods use ``hostNetwork``, so a task's IP is its node's; here each node is a
namespace ``cdpaiK`` with ``eth0`` at ``10.80.0.K+1/24`` behind the bridge ``cdpaibr0``.
No daemons run inside: tests start the launchers themselves with ``nsenter --net``.
One set at a time per machine (a lock on ``/run/cdpai.lock``); leftovers of a crashed
run (namespaces named ``cdpai*``, the bridge, processes inside them) are removed first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator

PREFIX = "cdpai"
BRIDGE = f"{PREFIX}br0"
SUBNET = "10.80.0"
LOCK_FILE = f"/run/{PREFIX}.lock"
NETNS_DIR = "/var/run/netns"
#: The interface every node has; GLOO_SOCKET_IFNAME must name it.
IFNAME = "eth0"


@dataclass(frozen=True)
class Node:
    name: str
    ip: str

    @property
    def netns_path(self) -> str:
        return f"{NETNS_DIR}/{self.name}"

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside this node's network namespace."""
        return ["nsenter", f"--net={self.netns_path}", *command]

    def pids(self) -> list[int]:
        """Processes whose network namespace is this node's."""
        return pids_in_netns(os.stat(self.netns_path).st_ino)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (tests skip with it), or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"ip netns unavailable: {probe.stderr.strip()}"
    return None


@contextlib.contextmanager
def pai_nodes(count: int) -> Iterator[list[Node]]:
    """``count`` namespaces on a bridge; everything (processes included) removed on exit."""
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove_leftovers()
        nodes = [Node(f"{PREFIX}{k}", f"{SUBNET}.{k + 1}") for k in range(1, count + 1)]
        try:
            _ip("link", "add", BRIDGE, "type", "bridge")
            _ip("addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
            _ip("link", "set", BRIDGE, "up")
            for k, node in enumerate(nodes, start=1):
                _ip("netns", "add", node.name)
                _ip("link", "add", f"{PREFIX}v{k}", "type", "veth", "peer", "name", IFNAME, "netns", node.name)
                _ip("link", "set", f"{PREFIX}v{k}", "master", BRIDGE, "up")
                for args in (("addr", "add", f"{node.ip}/24", "dev", IFNAME), ("link", "set", IFNAME, "up"),
                             ("link", "set", "lo", "up")):
                    _ip("-n", node.name, *args)
            yield nodes
        finally:
            remove_leftovers()


def remove_leftovers() -> None:
    """End processes inside ``cdpai*`` namespaces (only these tests start any), delete them and the bridge."""
    names = [n for n in os.listdir(NETNS_DIR) if n.startswith(PREFIX)] if os.path.isdir(NETNS_DIR) else []
    pids = [pid for n in names for pid in pids_in_netns(os.stat(f"{NETNS_DIR}/{n}").st_ino)]
    _terminate(pids)
    for name in names:
        _ip("netns", "del", name, check=False)
    if os.path.exists(f"/sys/class/net/{BRIDGE}"):
        _ip("link", "del", BRIDGE, check=False)


def pids_in_netns(inode: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(f"/proc/{entry.name}/ns/net").st_ino == inode:
                    found.append(int(entry.name))
            except OSError:  # exited meanwhile
                continue
    return found


def _terminate(pids: list[int], grace: float = 2.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.05)


def _ip(*args: str, check: bool = True) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
