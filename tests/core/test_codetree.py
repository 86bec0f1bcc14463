"""The code tree (clusterddp/codetree): what a tree that cannot be shipped says, gitignore's
rules, and a host's cache filled, checked, repaired and shared, through the real store program
(``python -c STORE_SOURCE``, as a host runs it) over pipes (issue 34's bad input and faults;
the SSH side, link cut included, is tests/ssh/test_code_ship.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from clusterddp.codetree import ignore
from clusterddp.codetree.transfer import STORE_SOURCE, ShipError, Shipped, ship
from clusterddp.codetree.walk import CodeTreeError, Tree, scan

REPO = Path(__file__).resolve().parents[2]


class StoreProcess:
    """The host's store program, run here; the head's side talks to it over its pipes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", STORE_SOURCE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def sendall(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, size: int) -> bytes:
        assert self.proc.stdout is not None
        return self.proc.stdout.read1(size)

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)


def send(tree: Tree, cache: Path) -> Shipped:
    store = StoreProcess()
    try:
        return ship(store, tree, str(cache))
    finally:
        store.close()


def make(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


# -- what cannot be shipped: one line naming it ------------------------------------------


def test_a_symlink_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    root = make(tmp_path / "t", {"a.py": b"x"})
    (root / "secrets").symlink_to("/etc")
    (root / "inside").symlink_to("a.py")
    with pytest.raises(CodeTreeError) as caught:
        scan(str(root))
    assert str(caught.value).startswith("secrets is a symbolic link that points out of the tree (-> /etc)")
    (root / "secrets").unlink()
    tree = scan(str(root))
    assert ("inside", "l", 0, "a.py") in tree.entries  # a link inside the tree travels as a link


def test_a_fifo_and_a_socket_are_refused(tmp_path: Path) -> None:
    root = make(tmp_path / "t", {"a.py": b"x"})
    os.mkfifo(root / "pipe")
    with pytest.raises(CodeTreeError, match=r"^pipe is a FIFO, not a file: it cannot be shipped \(hint: exclude"):
        scan(str(root))
    assert scan(str(root), exclude=("pipe",)).digest  # excluded: fine
    (root / "pipe").unlink()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "sock"))
        with pytest.raises(CodeTreeError, match=r"^sock is a socket, not a file"):
            scan(str(root))


def test_an_unreadable_file_is_refused(request: pytest.FixtureRequest) -> None:
    """As an unprivileged user (root reads anything): the walk in a process that dropped to nobody."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    top = Path(tempfile.mkdtemp(prefix="cdship-"))  # tmp_path's parents are closed to nobody
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    os.chmod(top, 0o755)
    root = make(top / "t", {"a.py": b"x", "private.key": b"k"})
    os.chmod(root / "private.key", 0o600)
    code = ("import os, sys; sys.path.insert(0, sys.argv[2])\n"  # imported first: nobody cannot read /root
            "from clusterddp.codetree.walk import scan, CodeTreeError\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "try: scan(sys.argv[1])\nexcept CodeTreeError as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code, str(root), str(REPO)], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == ("private.key cannot be read: Permission denied (hint: fix its permissions, "
                                  "or exclude it in code.exclude)"), out.stdout + out.stderr


def test_a_file_that_changes_while_hashed_is_refused(tmp_path: Path) -> None:
    """A file whose bytes never match its size (a /proc file bind-mounted into the tree, in a
    private mount namespace): every read disagrees with the stat, as a file being written does."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private mount")
    root = make(tmp_path / "t", {"a.py": b"x", "train.log": b""})
    code = ("import sys; sys.path.insert(0, sys.argv[2])\n"
            "from clusterddp.codetree.walk import scan, CodeTreeError\n"
            "try: scan(sys.argv[1])\nexcept CodeTreeError as e: print(e)")
    script = f"mount --bind /proc/uptime {root / 'train.log'} && exec {sys.executable} -c \"$0\" \"$@\""
    out = subprocess.run(["unshare", "--mount", "sh", "-c", script, code, str(root), str(REPO)],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == ("train.log changed while it was hashed (2 reads): ship it once it stops changing "
                                  "(hint: exclude logs and outputs in code.exclude or .gitignore)"), out.stderr


def test_a_4gb_file_is_refused_by_the_guard_without_being_read(tmp_path: Path) -> None:
    root = make(tmp_path / "t", {"train.py": b"x" * 1000, "src/model.py": b"y" * 2000,
                                 **{f"data/{i}.csv": b"z" * 300 for i in range(4)}})
    with open(root / "checkpoints" / "last.pt" if (root / "checkpoints").mkdir() is None else "", "wb") as f:
        f.truncate(4 << 30)  # sparse: 4 GiB apparent, no blocks
    with pytest.raises(CodeTreeError) as caught:
        scan(str(root), max_bytes=1 << 30)
    assert str(caught.value) == (
        "the code tree is 4.0 GiB, over code.max_mb (1.0 GiB); biggest: checkpoints/last.pt 4.0 GiB, "
        "src/model.py 2.0 KiB, train.py 1000 B; directories: data/ 1.2 KiB "
        "(hint: exclude data and outputs in code.exclude or .gitignore, or raise code.max_mb)")


def test_names_with_newlines_and_invalid_utf8_travel_byte_for_byte(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    odd = [b"line\nbreak.py", b"caf\xe9.py", b"sub\xff/x\ty.txt"]
    for name in odd:
        path = os.path.join(bytes(root), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(name)
    tree = scan(str(root))
    shipped = send(tree, tmp_path / "cache")
    for name in odd:
        with open(os.path.join(os.fsencode(shipped.path), name), "rb") as f:
            assert f.read() == name
    assert shipped.digest == tree.digest and shipped.files == 3


# -- gitignore --------------------------------------------------------------------------


def test_gitignore_rules(tmp_path: Path) -> None:
    root = make(tmp_path / "t", {
        ".gitignore": b"*.log\n!keep.log\n/build/\ndocs/**/*.html\nout\n\\#hash\ntrail   \n",
        "a.log": b"", "keep.log": b"", "build/x": b"", "sub/build/y": b"", "docs/a/b/c.html": b"",
        "docs/i.html": b"", "out": b"", "sub/out/z": b"", "#hash": b"", "trail": b"", "ok.py": b"",
        "sub/.gitignore": b"!*.log\nlocal.txt\n", "sub/s.log": b"", "sub/local.txt": b"", "local.txt": b"",
        "data/big.bin": b""})
    tree = scan(str(root), exclude=("data/",))  # docs/**/*.html: "**/" is zero or more directories
    assert sorted(e[0] for e in tree.entries) == [
        ".gitignore", "keep.log", "local.txt", "ok.py", "sub/.gitignore", "sub/build/y",
        "sub/s.log"]


def test_gitignore_matches_git_check_ignore(tmp_path: Path) -> None:
    """The same verdicts as git itself on a pattern set (when git is installed)."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    patterns = ["*.pyc", "!important.pyc", "/top.txt", "a/**/deep", "**/logs", "dir/", "x?z", "[ab]c.txt"]
    paths = ["m.pyc", "important.pyc", "top.txt", "sub/top.txt", "a/deep", "a/b/c/deep", "q/logs", "logs",
             "dir/f", "xyz", "xz", "ac.txt", "cc.txt", "d/ac.txt"]
    root = make(tmp_path / "r", {".gitignore": ("\n".join(patterns) + "\n").encode()})
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    rules = ignore.parse(patterns)
    for path in paths:
        theirs = subprocess.run(["git", "-C", str(root), "check-ignore", "--no-index", "-q", path]).returncode == 0
        is_dir = path == "dir/f"
        ours = any(ignore.ignored(rules, "/".join(path.split("/")[:i]), i < path.count("/") + 1)
                   for i in range(1, path.count("/") + 2)) if is_dir else ignore.ignored(rules, path, False)
        assert ours == theirs, path


# -- the host's cache ---------------------------------------------------------------------


def test_only_missing_blobs_travel_and_a_damaged_cache_is_repaired(tmp_path: Path) -> None:
    root = make(tmp_path / "t", {"a.py": b"a" * 100, "b/b.py": b"b" * 200, "run.sh": b"#!/bin/sh\n"})
    os.chmod(root / "run.sh", 0o755)
    cache = tmp_path / "cache"
    first = send(scan(str(root)), cache)
    assert (first.sent, first.files) == (310, 3)
    assert os.access(os.path.join(first.path, "run.sh"), os.X_OK)
    assert send(scan(str(root)), cache).sent == 0  # unchanged: nothing travels
    (root / "a.py").write_bytes(b"A" * 100)
    assert send(scan(str(root)), cache).sent == 100  # one edit: that file only

    # corrupt a blob through the shipped tree (a job writing into its own code)
    tree = scan(str(root))
    target = os.path.join(first.path, "b", "b.py")
    os.chmod(target, 0o644)
    with open(target, "r+b") as f:
        f.write(b"X")
    again = send(tree, cache)
    assert again.sent == 200
    assert Path(again.path, "b", "b.py").read_bytes() == b"b" * 200
    # a file removed from a tree: the tree is rebuilt from the cache, nothing travels
    Path(again.path, "a.py").unlink()
    assert send(tree, cache).sent == 0
    assert Path(again.path, "a.py").read_bytes() == b"A" * 100
    # ... and when its blob went too (a cleaned cache), that file travels again
    blob = next(p for p in (cache / "blobs").rglob("*") if p.is_file() and p.read_bytes() == b"#!/bin/sh\n")
    blob.unlink()
    Path(again.path, "run.sh").unlink()
    assert send(tree, cache).sent == 10
    assert Path(again.path, "run.sh").read_bytes() == b"#!/bin/sh\n"


def test_a_stream_cut_mid_transfer_leaves_no_tree(tmp_path: Path) -> None:
    root = make(tmp_path / "t", {"a.bin": os.urandom(3 << 20)})
    tree = scan(str(root))
    store = StoreProcess()
    reader_lines = b""
    store.sendall(f'{{"cache": "{tmp_path / "cache"}", "tree": "{tree.digest}", "size": {len(tree.manifest)}}}\n'
                  .encode())
    store.sendall(tree.manifest)
    while b"\n" not in reader_lines:
        reader_lines += store.recv(1000)
    store.sendall(b"x" * (1 << 20))  # a third of the file, then the link goes
    assert store.close() == 1
    assert not (tmp_path / "cache" / "trees" / tree.digest).exists()
    assert send(tree, tmp_path / "cache").sent == 3 << 20  # the next shipment completes it


def test_two_jobs_shipping_to_one_host_at_once(tmp_path: Path) -> None:
    files = {f"m{i}/f{j}.py": os.urandom(20000) for i in range(10) for j in range(20)}
    root_a = make(tmp_path / "a", files)
    root_b = make(tmp_path / "b", {**files, "extra.py": b"only b"})
    trees = [scan(str(root_a)), scan(str(root_b))]
    results: list[Shipped | BaseException] = [ShipError("not run")] * 4
    cache = tmp_path / "cache"

    def one(k: int) -> None:
        try:
            results[k] = send(trees[k % 2], cache)
        except BaseException as exc:  # noqa: BLE001  # reported below
            results[k] = exc

    threads = [threading.Thread(target=one, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for k, result in enumerate(results):
        assert isinstance(result, Shipped), result
        for name, data in files.items():
            assert Path(result.path, name).read_bytes() == data
        assert result.digest == trees[k % 2].digest
    assert Path(results[1].path, "extra.py").read_bytes() == b"only b"  # type: ignore[union-attr]
    assert not [p for p in (cache / "blobs").rglob(".in-*")]
