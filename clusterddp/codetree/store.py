"""A host's content-addressed cache of code trees, and the program that fills it.

The head sends this file's source as ``<python> -c SOURCE`` over a channel of the host's SSH
connection (like the stub: it must run where clusterddp is not importable, and the tree may
be the very code that is missing there), then talks to it over that channel's stdin/stdout:

1. head -> host: one JSON line ``{"cache": DIR, "tree": HASH, "size": N}``, then the N bytes
   of the manifest (``manifest_bytes``: the tree's files, sorted, each with its sha256).
2. host: the manifest must hash to HASH; the tree ``DIR/trees/HASH`` is checked if present
   (a damaged one is taken apart); the blobs it still lacks are listed;
   host -> head: ``{"missing": [KEY, ...]}``.
3. head -> host: each missing blob's bytes, in that order, back to back (sizes are in the
   manifest). Each is hashed while written to a temporary file and renamed into
   ``DIR/blobs/`` only when its hash checks.
4. host: the tree is built from hard links to the blobs in a temporary directory, every file
   checked, and renamed to ``DIR/trees/HASH`` in one step (a half tree is never under that
   name); host -> head: ``{"tree": HASH, "path": ..., "received": BYTES}`` or
   ``{"error": LINE}``.

Why a stream through one program and not SFTP: SFTP costs a round trip per file (open,
write, close: 30,000 for a 10,000-file tree, each waiting on the host), where the stream has
two round trips per job whatever the tree; and the hashing and linking happen on the host.

A blob is stored read-only with a fixed mtime (``SENTINEL_NS``): a write into it (through
any of its hard links, e.g. a job editing its own shipped file) moves its mtime, so a cheap
``lstat`` finds a changed blob and only that one is hashed again (and replaced when its hash
no longer checks). Standard library only, and Python 3.8 (the host's interpreter).
"""

import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from typing import IO, Any, Dict, List, Optional, Set, Tuple

#: Every blob's mtime, in ns (2000-01-01): anything else means someone wrote to it.
SENTINEL_NS = 946684800 * 10**9
CHUNK = 1 << 20
#: Manifest entry kinds: a file, an executable file, a symbolic link (inside the tree).
FILE, EXEC, LINK = "f", "x", "l"

Entry = Tuple[str, str, int, str]  # (path, kind, size, sha256 hex or link target)


class StoreError(Exception):
    """One line that says what went wrong on the host."""


def manifest_bytes(entries: List[Entry]) -> bytes:
    """The canonical manifest: entries sorted by path, compact ASCII JSON (names that are not
    UTF-8 travel as ``\\udcXX`` escapes, ``os.fsdecode``'s surrogates)."""
    ordered = sorted(entries, key=lambda e: e[0].encode("utf-8", "surrogateescape"))
    return json.dumps([list(e) for e in ordered], separators=(",", ":"), ensure_ascii=True).encode("ascii")


def tree_hash(manifest: bytes) -> str:
    return hashlib.sha256(manifest).hexdigest()


def read_manifest(data: bytes) -> List[Entry]:
    entries = []
    for item in json.loads(data.decode("ascii")):
        path, kind, size, digest = item
        if kind not in (FILE, EXEC, LINK) or not _safe(path):
            raise StoreError("bad manifest entry %r" % (path,))
        entries.append((str(path), str(kind), int(size), str(digest)))
    return entries


def _safe(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def blob_key(kind: str, digest: str) -> str:
    """The blob's name in the cache: its hash, ``.x`` for an executable (a hard link shares
    its mode)."""
    return digest + ".x" if kind == EXEC else digest


def _fs(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


class Store:
    """``ROOT/blobs/AB/HASH[.x]`` and ``ROOT/trees/TREEHASH/...``."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.blobs = os.path.join(self.root, "blobs")
        self.trees = os.path.join(self.root, "trees")
        self._made: Set[str] = set()

    def blob_path(self, key: str) -> str:
        return os.path.join(self.blobs, key[:2], key)

    def blob_ok(self, key: str, size: int) -> bool:
        """Whether the cached blob is whole: its size and the sentinel mtime (one lstat); a
        blob whose mtime moved is hashed again, kept when it still checks, else removed."""
        path = self.blob_path(key)
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if stat.S_ISREG(st.st_mode) and st.st_size == size and st.st_mtime_ns == SENTINEL_NS:
            return True
        if stat.S_ISREG(st.st_mode) and st.st_size == size and _sha_file(path) == key.split(".")[0]:
            os.utime(path, ns=(SENTINEL_NS, SENTINEL_NS))
            return True
        _remove(path)  # corrupt: fetched again
        return False

    def missing(self, entries: List[Entry]) -> List[str]:
        """The blob keys the tree needs that the cache lacks (each once, in manifest order)."""
        seen = set()
        keys = []
        for path, kind, size, digest in entries:
            if kind == LINK:
                continue
            key = blob_key(kind, digest)
            if key not in seen:
                seen.add(key)
                if not self.blob_ok(key, size):
                    keys.append(key)
        return keys

    def receive(self, key: str, size: int, source: IO[bytes]) -> None:
        """One blob from ``source``: exactly ``size`` bytes, hashed as written, renamed into
        place only when the hash checks."""
        final = self.blob_path(key)
        folder = os.path.dirname(final)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        tmp = os.path.join(folder, ".in-%s-%d" % (key, os.getpid()))
        digest = hashlib.sha256()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                left = size
                while left:
                    chunk = source.read(min(CHUNK, left))
                    if not chunk:
                        raise StoreError("the head's stream ended inside a file")
                    digest.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                    left -= len(chunk)
                if digest.hexdigest() != key.split(".")[0]:
                    raise StoreError("a file arrived damaged (its hash does not check)")
                os.fchmod(fd, 0o555 if key.endswith(".x") else 0o444)
                os.utime(fd, ns=(SENTINEL_NS, SENTINEL_NS))
            finally:
                os.close(fd)
            self._settle(tmp, final, key, size)
        finally:
            _remove(tmp)

    def _settle(self, tmp: str, final: str, key: str, size: int) -> None:
        """``tmp`` becomes the blob unless a whole one is already there (another job's, that
        arrived meanwhile): a blob's inode never changes under a tree linked to it."""
        for _ in range(3):
            try:
                os.link(tmp, final)
                return
            except FileExistsError:
                if self.blob_ok(key, size):  # removes a damaged one: link again
                    return
        raise StoreError("cannot store a blob in the cache (it keeps changing)")

    def tree_ok(self, digest: str, entries: List[Entry]) -> bool:
        """Whether ``trees/DIGEST`` is whole: one ``lstat`` per file (a hard link shares its
        blob's inode, so the sentinel mtime and the size say the bytes were not written since
        they were checked); a file whose mtime moved is hashed again, and when that fails its
        blob (the same inode) goes too, so the next shipment sends it again."""
        top = os.path.join(self.trees, digest)
        if not os.path.isdir(top):
            return False
        base = _fs(top) + b"/"
        for path, kind, size, target in entries:
            where = base + _fs(path)
            try:
                st = os.lstat(where)
            except OSError:
                return False
            if kind == LINK:
                if not stat.S_ISLNK(st.st_mode) or os.readlink(where) != _fs(target):
                    return False
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size == size and st.st_mtime_ns == SENTINEL_NS:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size == size and _sha_file(where) == target:
                os.utime(where, ns=(SENTINEL_NS, SENTINEL_NS))
                continue
            self.blob_ok(blob_key(kind, target), size)  # removes the blob when it is this damaged inode
            return False
        return True

    def build(self, digest: str, entries: List[Entry]) -> str:
        """The tree, from hard links in a temporary directory, renamed into place whole; a
        tree another job built meanwhile wins (the same content)."""
        os.makedirs(self.trees, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=self.trees, prefix=".build-%s-" % digest[:12])
        os.chmod(tmp, 0o755)
        try:
            for path, kind, size, target in entries:
                where = os.path.join(_fs(tmp), _fs(path))
                os.makedirs(os.path.dirname(where), exist_ok=True)
                if kind == LINK:
                    os.symlink(_fs(target), where)
                    continue
                blob = self.blob_path(blob_key(kind, target))
                try:
                    os.link(blob, where)
                except OSError:  # another filesystem, a link limit: a copy, checked like a link
                    shutil.copy2(_fs(blob), where)
            final = os.path.join(self.trees, digest)
            try:
                os.rename(tmp, final)
            except OSError:
                if not os.path.isdir(final):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
            return final
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def discard_tree(self, digest: str) -> None:
        """A damaged tree moved aside (one rename: no job starts in half of it) and removed."""
        top = os.path.join(self.trees, digest)
        if os.path.lexists(top):
            aside = tempfile.mkdtemp(dir=self.trees, prefix=".old-")
            try:
                os.rename(top, os.path.join(aside, "t"))
            except OSError:
                pass
            shutil.rmtree(aside, ignore_errors=True)


def _sha_file(path: "str | bytes") -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _read_exact(source: IO[bytes], size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = source.read(size - len(data))
        if not chunk:
            raise StoreError("the head's stream ended early")
        data += chunk
    return data


def _say(out: IO[bytes], message: Dict[str, Any]) -> None:
    out.write(json.dumps(message).encode("utf-8") + b"\n")
    out.flush()


def serve(source: IO[bytes], out: IO[bytes]) -> Optional[str]:
    """The host's side of one shipment (the protocol above); the tree's path."""
    header = json.loads(source.readline().decode("utf-8"))
    manifest = _read_exact(source, int(header["size"]))
    if tree_hash(manifest) != header["tree"]:
        raise StoreError("the manifest arrived damaged")
    entries = read_manifest(manifest)
    store = Store(header["cache"])
    digest = str(header["tree"])
    if os.path.lexists(os.path.join(store.trees, digest)) and not store.tree_ok(digest, entries):
        store.discard_tree(digest)  # stale or damaged: rebuilt from checked blobs
    sizes = {blob_key(kind, target): size for _, kind, size, target in entries if kind != LINK}
    missing = [] if store.tree_ok(digest, entries) else store.missing(entries)
    _say(out, {"missing": missing})
    received = 0
    for key in missing:
        store.receive(key, sizes[key], source)
        received += sizes[key]
    if not store.tree_ok(digest, entries):
        store.discard_tree(digest)
        store.build(digest, entries)
        if not store.tree_ok(digest, entries):
            raise StoreError("the tree built here does not check against its hash")
    _say(out, {"tree": tree_hash(manifest), "path": os.path.join(store.trees, digest), "received": received})
    return digest


def main() -> None:
    out = sys.stdout.buffer
    try:
        serve(sys.stdin.buffer, out)
    except (StoreError, OSError, ValueError, KeyError) as exc:
        text = str(exc) if isinstance(exc, StoreError) else "%s: %s" % (type(exc).__name__, exc)
        _say(out, {"error": text})
        sys.exit(1)


if __name__ == "__main__":  # "python -c SOURCE" runs as __main__
    main()
