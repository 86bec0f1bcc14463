"""Without a head (SLURM, OpenPAI, Kubernetes): node 0 judges every node's ranks when the
nodes share the run directory.

Over SSH the head sees every host's progress files (they come down its sessions). Under
srun or in pods there is no such process, but the nodes usually share the log filesystem
(checkpoints need one anyway), and every rank's progress file is already a file of the run
directory (``rank<R>.heartbeat``). So a launcher that is one node of several writes a marker,
``node<K>.here``, when an attempt starts: its host, its ranks' record files, the attempt and
a random nonce. Node 0 looks for the others' markers (at most once a second, only for nodes
not found yet); a marker of this run and attempt, naming exactly the ranks that node has,
adds that node's record files to node 0's one read of records (``runlog.RunLog``), and node
0 acknowledges it by its nonce in ``node0.sees``.

Nothing is assumed. A node that finds its own nonce in ``node0.sees`` knows that node 0 reads
what it writes: it leaves the straggler check, and ``hang_timeout: auto`` once its ranks
stepped, to node 0, which sees the phases of every node (a checkpoint on node 0 makes node
1's ranks wait without a step: alone, node 1 would call it a hang). A node not acknowledged
goes on judging its own ranks as before; node 0 says so in one line once its ranks stepped
and ``MARKER_WAIT`` passed (a shared filesystem may show another host's new file late).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from clusterddp.atomicfile import WriteError, write_atomically
from clusterddp.protocol import PEERS_SEEN_FILE, peer_marker_name
from clusterddp.stackreport import format_ranks
from clusterddp.topology import Topology
from clusterddp.validate import host_problem, read_json_object

#: Seconds between two looks for markers (node 0) or for the acknowledgement (node K).
POLL_INTERVAL = 1.0
#: Seconds after the attempt's start (and not before node 0's ranks stepped) at which node 0
#: says which nodes it does not see. NFS caches a directory's attributes up to 60 s by default
#: (``acdirmax``), so a marker may show late; one found later is still taken, with a line.
MARKER_WAIT = 30.0
#: A marker written this long before node 0's attempt started belongs to an earlier run with
#: the same id and attempt (a requeued SLURM job waits at least the credential lifetime,
#: 120 s by default, before it starts again); allows for the nodes' clocks to differ.
SKEW = 60.0
#: A marker or acknowledgement bigger than this is not one.
MAX_BYTES = 64 << 10
_RECORD_FILE = re.compile(r"[A-Za-z0-9_.-]{1,255}")


@dataclass(frozen=True)
class Peer:
    """Another node whose ranks' records node 0 reads."""

    node: int
    host: str
    #: (rank, record file in node 0's view of the run directory)
    files: tuple[tuple[int, str], ...]


@dataclass
class SharedRunDir:
    """This node's side of the exchange above; ``runlog.RunLog`` drives it on its reads."""

    run_dir: str
    topology: Topology
    say: Callable[[str], None]
    clock: Callable[[], float] = time.time
    #: node 0: the other nodes found, by node rank.
    peers: dict[int, Peer] = field(default_factory=dict)
    #: node K > 0: node 0 acknowledged this node's marker, so node 0 judges its ranks.
    judged_elsewhere: bool = False
    _attempt: int = 0
    _began: float = 0.0
    _nonce: str = ""
    _next_poll: float = 0.0
    _said_alone: bool = False
    #: node 0: the nonce of every node found (what ``PEERS_SEEN_FILE`` acknowledges).
    _nonces: dict[int, str] = field(default_factory=dict)

    @property
    def files(self) -> list[tuple[int, str]]:
        """The other nodes' ranks' record files node 0 reads with its own (none elsewhere)."""
        return [item for peer in self.peers.values() for item in peer.files]

    @property
    def hosts(self) -> dict[int, str]:
        """The host of every other node's rank node 0 judges."""
        return {rank: peer.host for peer in self.peers.values() for rank, _ in peer.files}

    def attempt_started(self, attempt: int, files: Sequence[tuple[int, str]]) -> None:
        """A new attempt: forget what was found; a node K writes its marker for it."""
        self._attempt, self._began = attempt, self.clock()
        self.peers, self.judged_elsewhere, self._said_alone, self._next_poll = {}, False, False, 0.0
        self._nonces = {}
        self._nonce = secrets.token_hex(8)
        if self.topology.node_rank == 0:
            return
        marker = {"run_id": self.topology.run_id, "attempt": attempt, "node": self.topology.node_rank,
                  "host": self.topology.host, "nonce": self._nonce, "t": self._began,
                  "files": [[rank, os.path.basename(path)] for rank, path in files]}
        try:
            write_atomically(os.path.join(self.run_dir, peer_marker_name(self.topology.node_rank)),
                             json.dumps(marker), durable=False)
        except WriteError:
            pass  # node 0 will not see this node: each judges its own ranks, and node 0 says so

    def sees_all(self) -> bool:
        """Node 0: does it read every other node's records in this attempt (looked for now)?
        A restart in place (``stepcoord``) needs every node to take part."""
        missing = [node for node in range(1, self.topology.nnodes) if node not in self.peers]
        if missing and any(self._peer(node) is not None for node in missing):
            self._acknowledge()
        return len(self.peers) == self.topology.nnodes - 1

    def acknowledged(self) -> bool:
        """Node K: has node 0 acknowledged this node's marker of this attempt (looked for now)?"""
        self._next_poll = 0.0
        self.poll(False)
        return self.judged_elsewhere

    def poll(self, stepped: bool) -> None:
        """Look again (at most every ``POLL_INTERVAL``): node 0 for the markers it lacks,
        node K for its acknowledgement. ``stepped``: this node's ranks completed a step."""
        now = self.clock()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_INTERVAL
        if self.topology.node_rank != 0:
            if not self.judged_elsewhere:
                sees = read_json_object(os.path.join(self.run_dir, PEERS_SEEN_FILE), MAX_BYTES)
                nodes = sees.get("nodes") if sees else None
                self.judged_elsewhere = bool(
                    sees and sees.get("run_id") == self.topology.run_id and sees.get("attempt") == self._attempt
                    and isinstance(nodes, dict) and nodes.get(str(self.topology.node_rank)) == self._nonce)
            return
        missing = [node for node in range(1, self.topology.nnodes) if node not in self.peers]
        if not missing:
            return
        found = [peer for peer in (self._peer(node) for node in missing) if peer is not None]
        if found:
            self._acknowledge()
        if self._said_alone and found:
            self.say(f"clusterddp: node 0 now also judges the progress of {_named(found)}")
        late = stepped and now - self._began >= MARKER_WAIT
        if late and not self._said_alone and len(self.peers) < self.topology.nnodes - 1:
            self._said_alone = True
            unseen = [node for node in range(1, self.topology.nnodes) if node not in self.peers]
            who = (f"node 0 judges its own ranks and those of {_named(list(self.peers.values()))}, the others "
                   "only their own" if self.peers else "each node judges only its own ranks")
            self.say(f"clusterddp: node 0 sees no progress file of node(s) {_nodes(unseen, self.topology)} in "
                     f"{self.run_dir} (not a directory the nodes share?): {who} (slow host, hang_timeout auto)")

    def _peer(self, node: int) -> Peer | None:
        """Node ``node``'s marker for this run and attempt, when it names that node's ranks."""
        marker = read_json_object(os.path.join(self.run_dir, peer_marker_name(node)), MAX_BYTES)
        if not marker or marker.get("run_id") != self.topology.run_id or marker.get("attempt") != self._attempt \
                or marker.get("node") != node or not isinstance(marker.get("nonce"), str):
            return None
        written, host, listed = marker.get("t"), marker.get("host"), marker.get("files")
        if not isinstance(written, (int, float)) or written < self._began - SKEW:
            return None  # an earlier run's
        if not isinstance(host, str) or host_problem(host) or not isinstance(listed, list):
            return None
        first = self.topology.first_rank(node)
        expected = list(range(first, first + self.topology.workers_on(node)))
        files = []
        for item in listed:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
                    and isinstance(item[1], str) and _RECORD_FILE.fullmatch(item[1]) and item[1] not in (".", "..")):
                return None
            files.append((item[0], os.path.join(self.run_dir, item[1])))
        if sorted(rank for rank, _ in files) != expected:
            return None
        peer = Peer(node, host, tuple(files))
        self.peers[node] = peer
        self._nonces[node] = str(marker["nonce"])
        return peer

    def _acknowledge(self) -> None:
        sees = {"run_id": self.topology.run_id, "attempt": self._attempt,
                "nodes": {str(node): self._nonces[node] for node in sorted(self.peers)}}
        try:
            write_atomically(os.path.join(self.run_dir, PEERS_SEEN_FILE), json.dumps(sees), durable=False)
        except WriteError:
            pass  # those nodes go on judging their own ranks too: a slow host may be named twice


def shared_run_dir(run_dir: str | None, topology: Topology, headed: bool,
                   say: Callable[[str], None]) -> SharedRunDir | None:
    """The exchange for a launcher that is one node of several with no head; None otherwise
    (one node judges alone; under the SSH head, ``headed``, the head judges every host)."""
    if run_dir is None or headed or topology.nnodes < 2:
        return None
    return SharedRunDir(run_dir, topology, say)


def _named(peers: Sequence[Peer]) -> str:
    return ", ".join(f"node {peer.node} ({peer.host}, rank(s) {format_ranks([r for r, _ in peer.files])})"
                     for peer in peers)


def _nodes(nodes: Sequence[int], topology: Topology) -> str:
    hosts = topology.hosts
    return ", ".join(f"{node} ({hosts[node]})" if node < len(hosts) else str(node) for node in nodes)
