"""The head's side of a shipment over any byte stream to ``store.serve`` on a host (an SSH
channel running ``python -c STORE_SOURCE``): the manifest, the blobs the host asks for, its
answer checked against the tree's hash.

Duck-typed on the stream (``sendall``, ``recv``), so it needs no SSH library and the SLURM
side can reuse it over another pipe.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from clusterddp.codetree.store import CHUNK, LINK, blob_key
from clusterddp.codetree.gitstate import GitState
from clusterddp.codetree.walk import Tree

#: What a host runs: ``python -c`` this file's source (standard library only).
STORE_SOURCE = Path(__file__).with_name("store.py").read_text(encoding="utf-8")
#: The hosts' cache unless the job sets ``code.cache`` (``~``: the host's home).
DEFAULT_CACHE = "~/.cache/clusterddp/code"


class Stream(Protocol):
    def sendall(self, data: bytes) -> None: ...

    def recv(self, size: int) -> bytes: ...


class ShipError(Exception):
    """The host did not end up with the tree; ``str()`` is one line (the caller names the host)."""


@dataclass(frozen=True)
class CodePlan:
    """What a job ships: the tree (walked and hashed once, before any host is contacted),
    where each host keeps it, and what the run record says of it."""

    tree: Tree
    cache: str = DEFAULT_CACHE
    git: GitState = GitState()


@dataclass(frozen=True)
class Shipped:
    """Where the tree is on one host, and what travelled."""

    path: str
    digest: str
    #: File bytes sent (0 when the host had every blob).
    sent: int
    files: int


def ship(stream: Stream, tree: Tree, cache: str = DEFAULT_CACHE) -> Shipped:
    """Send ``tree`` to the ``store.serve`` at the other end of ``stream``; raise ShipError
    unless the host answers with the tree's own hash."""
    reader = _Lines(stream)
    stream.sendall(json.dumps({"cache": cache, "tree": tree.digest, "size": len(tree.manifest)}).encode() + b"\n")
    stream.sendall(tree.manifest)
    asked = reader.message()
    missing = [str(key) for key in asked["missing"]]  # type: ignore[attr-defined]  # a JSON list
    paths = {blob_key(kind, digest): (rel, size) for rel, kind, size, digest in tree.entries if kind != LINK}
    sent = 0
    batch = _Batch(stream)
    for key in missing:
        if key not in paths:
            raise ShipError(f"the host asked for a file that is not in the tree ({key[:12]})")
        rel, size = paths[key]
        sent += _send_file(batch, tree.sources[rel], size, rel)
    batch.flush()
    answer = reader.message()
    if answer.get("tree") != tree.digest:
        raise ShipError(f"code tree hash mismatch: the host has {str(answer.get('tree'))[:12]}, "
                        f"the head {tree.digest[:12]}; no worker was started")
    return Shipped(path=str(answer["path"]), digest=tree.digest, sent=sent, files=len(missing))


class _Batch:
    """Small files sent together (one SSH packet carries many): a 10,000-file tree is mostly
    files of a few KiB, and each ``sendall`` costs a packet and its MAC on both ends."""

    def __init__(self, stream: Stream, size: int = CHUNK) -> None:
        self.stream = stream
        self.size = size
        self.buffer = bytearray()

    def sendall(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) >= self.size:
            self.flush()

    def recv(self, size: int) -> bytes:
        return self.stream.recv(size)

    def flush(self) -> None:
        if self.buffer:
            self.stream.sendall(bytes(self.buffer))
            self.buffer.clear()


def _send_file(stream: Stream, path: bytes, size: int, rel: str) -> int:
    """Exactly ``size`` bytes of the file as hashed; a file that changed since is refused (the
    host would refuse its hash anyway, later and less clearly)."""
    left = size
    with open(path, "rb") as f:
        while left:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                break
            stream.sendall(chunk)
            left -= len(chunk)
    if left or os.stat(path).st_size != size:
        raise ShipError(f"{rel} changed after it was hashed: ship again once it stops changing")
    return size


class _Lines:
    """The host's JSON lines, read from the stream; an ``error`` answer is a ShipError."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.buffer = b""

    def message(self) -> dict[str, object]:
        while b"\n" not in self.buffer:
            chunk = self.stream.recv(65536)
            if not chunk:
                raise ShipError("the host's cache program ended without answering"
                                + (f": {self.buffer.decode('utf-8', 'replace').strip()[-200:]}" if self.buffer else ""))
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            raise ShipError(f"unexpected answer from the host: {line.decode('utf-8', 'replace')[:200]}") from None
        if not isinstance(message, dict):
            raise ShipError(f"unexpected answer from the host: {line.decode('utf-8', 'replace')[:200]}")
        if "error" in message:
            raise ShipError(f"code tree not stored: {message['error']}")
        return message


def shipped_path(head_path: str, root: str, remote_root: str) -> str:
    """``head_path`` as it is in the shipped tree (the same place relative to the tree's root);
    a path outside the tree unchanged."""
    head_path = os.path.abspath(head_path)
    if os.path.commonpath([head_path, root]) != root:
        return head_path
    rel = os.path.relpath(head_path, root)
    return remote_root if rel == "." else os.path.join(remote_root, rel)
