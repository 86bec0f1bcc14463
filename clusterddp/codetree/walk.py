"""The head's side: the tree walked (``.gitignore`` + ``code.exclude``), refused when too
big, hashed by content into a manifest (``store.manifest_bytes``) whose sha256 names it.

Content, not timestamps, says what changed (SkyPilot skipped files whose mtime matched,
skypilot#2303): every file is read and hashed on every run; a file that changes while it is
read is read again, then refused. Everything that cannot be shipped faithfully is one line
naming it, before any host is contacted: a symbolic link out of the tree, a socket, FIFO or
device, a file that cannot be read, a tree over ``code.max_mb`` (naming its biggest
entries).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field

from clusterddp.codetree import ignore
from clusterddp.codetree.store import CHUNK, EXEC, FILE, LINK, Entry, manifest_bytes, tree_hash

#: Never shipped: version control's own data (SkyPilot took 15 minutes over a .git,
#: skypilot#1600) and Python's byte-code caches (each host writes its own).
ALWAYS_EXCLUDED = (".git/", "__pycache__/", ".hg/", ".svn/")
#: Reads of a file that keeps changing before it is refused.
HASH_TRIES = 2


class CodeTreeError(Exception):
    """The tree cannot be shipped as it is; ``str()`` is the one line to show (with a hint)."""


@dataclass(frozen=True)
class Tree:
    """A walked, hashed tree: what the hosts must end up with, byte for byte."""

    root: str
    entries: tuple[Entry, ...]
    manifest: bytes
    digest: str
    #: Head-side file of each regular entry (the bytes to send), by path in the tree.
    sources: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    @property
    def size(self) -> int:
        return sum(e[2] for e in self.entries if e[1] != LINK)


def scan(root: str, exclude: tuple[str, ...] = (), max_bytes: int | None = None) -> Tree:
    """Walk ``root`` (its ``.gitignore`` files honoured, then ``exclude``), check the size
    guard on the sizes first (a 4 GB file is refused without being read), then hash."""
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise CodeTreeError(f"code.dir {root} is not a directory")
    forced = ignore.parse([*ALWAYS_EXCLUDED, *exclude])
    found: list[tuple[str, bytes, os.stat_result]] = []
    _walk(os.fsencode(root), "", [], forced, found, root)
    if max_bytes is not None:
        guard(found, max_bytes)
    entries: list[Entry] = []
    sources: dict[str, bytes] = {}
    for rel, path, st in found:
        if stat.S_ISLNK(st.st_mode):
            entries.append((rel, LINK, 0, os.fsdecode(os.readlink(path))))
            continue
        size, digest = hash_file(path, rel)
        entries.append((rel, EXEC if st.st_mode & 0o111 else FILE, size, digest))
        sources[rel] = path
    manifest = manifest_bytes(entries)
    return Tree(root=root, entries=tuple(entries), manifest=manifest, digest=tree_hash(manifest), sources=sources)


def _walk(directory: bytes, rel: str, rules: list[ignore.Rule], forced: list[ignore.Rule],
          found: list[tuple[str, bytes, os.stat_result]], root: str) -> None:
    """Depth first, names sorted; a directory's ``.gitignore`` applies to what is below it."""
    gitignore = os.path.join(directory, b".gitignore")
    if os.path.isfile(gitignore):
        with open(gitignore, encoding="utf-8", errors="surrogateescape") as f:
            rules = rules + ignore.parse(f, rel)
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise CodeTreeError(f"{_shown(rel or '.')} cannot be listed: {exc.strerror} "
                            "(hint: exclude it in code.exclude)") from None
    for name in names:
        path = os.path.join(directory, name)
        child = f"{rel}/{os.fsdecode(name)}" if rel else os.fsdecode(name)
        st = os.lstat(path)
        is_dir = stat.S_ISDIR(st.st_mode)
        if ignore.ignored(forced, child, is_dir) or ignore.ignored(rules, child, is_dir):
            continue
        if is_dir:
            _walk(path, child, rules, forced, found, root)
        elif stat.S_ISREG(st.st_mode):
            found.append((child, path, st))
        elif stat.S_ISLNK(st.st_mode):
            _check_link(path, child, root)
            found.append((child, path, st))
        else:
            kind = ("a socket" if stat.S_ISSOCK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a device")
            raise CodeTreeError(f"{_shown(child)} is {kind}, not a file: it cannot be shipped "
                                "(hint: exclude it in code.exclude or .gitignore)")


def _check_link(path: bytes, rel: str, root: str) -> None:
    """A link is shipped as a link only when what it names is inside the tree (a link out of
    it would name a different file, or nothing, on each host)."""
    target = os.path.realpath(path)
    inside = os.path.commonpath([os.fsencode(root), target]) == os.fsencode(root)
    if not inside or not os.path.exists(target):
        why = "points out of the tree" if not inside else "points to nothing"
        raise CodeTreeError(f"{_shown(rel)} is a symbolic link that {why} (-> {_shown(os.fsdecode(os.readlink(path)))}): "
                            "it would name a different file on each host (hint: copy what it names into the "
                            "tree, or exclude it in code.exclude)")


def guard(found: list[tuple[str, bytes, os.stat_result]], max_bytes: int) -> None:
    """Refuse a tree over ``max_bytes`` (apparent sizes: a sparse 4 GB file counts 4 GB),
    naming its biggest files and top-level directories."""
    total = sum(st.st_size for _, _, st in found if stat.S_ISREG(st.st_mode))
    if total <= max_bytes:
        return
    files = sorted(((st.st_size, rel) for rel, _, st in found if stat.S_ISREG(st.st_mode)), reverse=True)[:3]
    tops: dict[str, int] = {}
    for rel, _, st in found:
        if "/" in rel and stat.S_ISREG(st.st_mode):
            top = rel.split("/", 1)[0] + "/"
            tops[top] = tops.get(top, 0) + st.st_size
    # a directory that is only its listed file says nothing more
    dirs = sorted(((size, name) for name, size in tops.items()
                   if not any(rel.startswith(name) and fsize == size for fsize, rel in files)), reverse=True)[:2]
    biggest = ", ".join(f"{_shown(name)} {_mb(size)}" for size, name in files)
    within = ("; directories: " + ", ".join(f"{_shown(name)} {_mb(size)}" for size, name in dirs)) if dirs else ""
    raise CodeTreeError(f"the code tree is {_mb(total)}, over code.max_mb ({_mb(max_bytes)}); biggest: {biggest}"
                        f"{within} (hint: exclude data and outputs in code.exclude or .gitignore, or raise "
                        "code.max_mb)")


def hash_file(path: bytes, rel: str) -> tuple[int, str]:
    """(size, sha256) of the bytes read; read again when the file changed meanwhile (its size
    or mtime moved, or the bytes read differ from its size), refused when it keeps changing."""
    for _ in range(HASH_TRIES):
        try:
            with open(path, "rb") as f:
                before = os.fstat(f.fileno())
                digest = hashlib.sha256()
                size = 0
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    digest.update(chunk)
                    size += len(chunk)
                after = os.fstat(f.fileno())
        except OSError as exc:
            raise CodeTreeError(f"{_shown(rel)} cannot be read: {exc.strerror} "
                                "(hint: fix its permissions, or exclude it in code.exclude)") from None
        if (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns) and size == after.st_size:
            return size, digest.hexdigest()
    raise CodeTreeError(f"{_shown(rel)} changed while it was hashed ({HASH_TRIES} reads): ship it once it stops "
                        "changing (hint: exclude logs and outputs in code.exclude or .gitignore)")


def _mb(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _shown(name: str) -> str:
    """A path as one printable line: control characters (a newline in a name) and bytes that
    are not UTF-8 escaped, so the message stays one line."""
    text = repr(name)[1:-1] if not name.isprintable() else name
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
