"""OpenPAI task "nodes" on one machine: network namespaces on a bridge, nothing else.

OpenPAI pods use ``hostNetwork``, so a task's IP is its node's; here each node is a
namespace ``cdpaiK`` with ``eth0`` at ``10.80.0.K+1/24`` behind the bridge ``cdpaibr0``.
No daemons run inside: tests start the launchers themselves with ``nsenter --net``.
One set at a time per machine (a lock on ``/run/cdpai.lock``); leftovers of a crashed
run (namespaces named ``cdpai*``, the bridge, processes inside them) are removed first.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

from tests.testbed import namespaces
from tests.testbed.namespaces import NETNS_DIR, pids_in_netns

PREFIX = "cdpai"
BRIDGE = namespaces.bridge_name(PREFIX)
SUBNET = "10.80.0"
LOCK_FILE = f"/run/{PREFIX}.lock"
#: The interface every node has; GLOO_SOCKET_IFNAME must name it.
IFNAME = namespaces.IFNAME
#: Seconds a leftover process gets between SIGTERM and SIGKILL.
LEFTOVER_GRACE = 2.0


@dataclass(frozen=True)
class Node:
    """One OpenPAI task's node: a namespace with ``IFNAME`` on the bridge, and nothing running."""

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
    return namespaces.unavailable_reason("needs root to create network namespaces", ("ip", "nsenter"))


@contextlib.contextmanager
def pai_nodes(count: int) -> Iterator[list[Node]]:
    """``count`` namespaces on a bridge; everything (processes included) removed on exit."""
    with namespaces.exclusive(LOCK_FILE, remove_leftovers):
        yield [Node(name, ip) for name, ip in namespaces.build_network(PREFIX, SUBNET, count)]


def remove_leftovers() -> None:
    """End processes inside ``cdpai*`` namespaces (only these tests start any), delete them and our links."""
    namespaces.remove_leftovers(PREFIX, grace=LEFTOVER_GRACE)
