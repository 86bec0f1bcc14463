"""A checkpoint directory where every checkpoint is complete or ignored, never half-read.

Layout of ``checkpoint_dir``::

    ckpt-000007.pt      the state (torch.save of the dict ``checkpoint.save_checkpoint`` writes)
    ckpt-000007.json    its manifest: job, world size, position, and each file's size and sha256
    last.pt             a hard link to the newest published state (for tools; resume ignores it)
    .lock               held (flock) by the writing run's rank 0: two runs never share a directory

Publishing order: the state goes to a temp file, is fsync'ed and renamed to ``ckpt-N.pt``;
then the manifest (written last, atomically) makes it a checkpoint. A kill at any moment
leaves either no manifest (the state file is an orphan, ignored and later removed) or a
manifest whose sizes and hashes are checked at load: a truncated or edited file, or a
hand-edited manifest, is ignored with one line and resume takes the next newest one.
Sequence numbers only grow, so "newest" is the highest complete one. No torch here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

from clusterddp.atomicfile import fsync_dir

#: Bumped when the manifest's layout changes incompatibly.
MANIFEST_FORMAT = 1
#: The hard link to the newest state, kept for tools that read one file.
LAST_LINK = "last.pt"
LOCK_FILE = ".lock"
_NAME = re.compile(r"ckpt-(\d{6,})\.json")
_CHUNK = 1 << 22


class CheckpointError(RuntimeError):
    """A checkpoint directory cannot be used (locked by another run, not writable)."""


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds and how to check it."""

    seq: int
    files: dict[str, dict[str, Any]]   # name -> {"size": int, "sha256": str}
    job: str | None = None
    world_size: int = 1
    epoch: int = 0
    step: int = 0
    global_step: int = 0
    stall_s: float | None = None       # the training stall this save cost (its staging)
    write_s: float | None = None       # the background write, hashing included

    @property
    def state_file(self) -> str:
        return state_name(self.seq)


@dataclass
class Scan:
    """The result of looking for the newest complete checkpoint."""

    newest: tuple[Path, Manifest] | None = None
    ignored: list[str] = field(default_factory=list)  # one line each


def state_name(seq: int) -> str:
    return f"ckpt-{seq:06d}.pt"


def manifest_name(seq: int) -> str:
    return f"ckpt-{seq:06d}.json"


def sha256_of(path: Path) -> tuple[int, str]:
    """(size, hex sha256) of a file, read in 4 MB chunks (hashlib releases the GIL on them)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _sequences(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted((int(m.group(1)) for m in map(_NAME.fullmatch, names) if m), reverse=True)


def next_seq(directory: Path) -> int:
    """One above every manifest and state file present (a kill never reuses a number)."""
    numbers = [0]
    try:
        for name in os.listdir(directory):
            match = re.fullmatch(r"\.?ckpt-(\d{6,})\.(?:json|pt)(?:\.tmp\d+)?", name)
            if match:
                numbers.append(int(match.group(1)))
    except OSError:
        pass
    return max(numbers) + 1


def read_manifest(directory: Path, seq: int) -> Manifest:
    """The manifest of checkpoint ``seq``; ValueError with the reason when it is not one."""
    path = directory / manifest_name(seq)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"manifest unreadable ({type(exc).__name__})") from None
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"manifest format {raw.get('format') if isinstance(raw, dict) else None!r}, "
                         f"expected {MANIFEST_FORMAT}")
    try:
        files = raw["files"]
        if not isinstance(files, dict) or not files or any(
                not isinstance(v, dict) or not isinstance(v.get("size"), int)
                or not isinstance(v.get("sha256"), str) for v in files.values()):
            raise ValueError("manifest lists no files with size and sha256")
        manifest = Manifest(seq=int(raw["seq"]), files=files, job=raw.get("job"),
                            world_size=int(raw["world_size"]), epoch=int(raw["epoch"]),
                            step=int(raw["step"]), global_step=int(raw.get("global_step", 0)),
                            stall_s=raw.get("stall_s"), write_s=raw.get("write_s"))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"manifest lacks {exc}") from None
    if manifest.seq != seq or set(files) != {state_name(seq)}:
        raise ValueError("manifest names other files than its own")
    return manifest


def verify(directory: Path, manifest: Manifest) -> str | None:
    """None when every file has the manifest's size and hash, else the first difference."""
    for name, expected in manifest.files.items():
        path = directory / name
        try:
            actual_size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual_size != expected["size"]:
            return f"{name} has {actual_size} bytes, the manifest says {expected['size']}"
        if sha256_of(path)[1] != expected["sha256"]:
            return f"{name} does not match the manifest's sha256"
    return None


def newest_complete(directory: str | os.PathLike[str], *, job: str | None = None,
                    world_size: int | None = None,
                    fits: Callable[[Manifest], str | None] | None = None) -> Scan:
    """The newest checkpoint whose manifest checks out (and that belongs to this job), with a
    line for each newer one ignored. ``fits`` may refuse one (None: it fits)."""
    root = Path(directory)
    scan = Scan()
    for seq in _sequences(root):
        where = root / manifest_name(seq)
        try:
            manifest = read_manifest(root, seq)
        except ValueError as exc:
            scan.ignored.append(f"ignoring checkpoint {where}: {exc}")
            continue
        if job is not None and manifest.job is not None and manifest.job != job:
            scan.ignored.append(f"ignoring checkpoint {where}: written by job {manifest.job!r}, "
                                f"this is {job!r}")
            continue
        problem = fits(manifest) if fits is not None else None
        if problem is None:
            problem = verify(root, manifest)
        if problem is not None:
            scan.ignored.append(f"ignoring checkpoint {where}: {problem}")
            continue
        scan.newest = (root / manifest.state_file, manifest)
        break
    return scan


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def publish(directory: Path, manifest: Manifest, write: Callable[[BinaryIO], None],
            keep: int) -> Manifest:
    """Write the state with ``write(f)``, then its manifest; point ``last.pt`` at it and
    remove all but the newest ``keep`` checkpoints. Returns the manifest as written."""
    directory.mkdir(parents=True, exist_ok=True)
    name = manifest.state_file
    tmp = directory / f".{name}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            recording = _Recording(f)
            try:
                write(recording)  # type: ignore[arg-type]
            except RuntimeError:
                # torch.save turns the file's OSError (ENOSPC) into "unexpected pos N vs M"
                if recording.error is not None:
                    raise recording.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        size, digest = sha256_of(tmp)  # what is on disk, read back
        os.replace(tmp, directory / name)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(directory)
    done = Manifest(**{**manifest.__dict__, "files": {name: {"size": size, "sha256": digest}}})
    _write_json_atomically(directory / manifest_name(done.seq), {"format": MANIFEST_FORMAT,
                                                                 **done.__dict__})
    fsync_dir(directory)
    _link_last(directory, name)
    prune(directory, keep)
    return done


class _Recording:
    """A file's ``write`` that remembers the first OSError it raised (see ``publish``)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self._f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self._f.flush()


def _link_last(directory: Path, name: str) -> None:
    """``last.pt`` -> the new state, replaced atomically (a hard link: a plain file to readers)."""
    tmp = directory / f".{LAST_LINK}.tmp{os.getpid()}"
    try:
        if tmp.exists():
            tmp.unlink()
        os.link(directory / name, tmp)
        os.replace(tmp, directory / LAST_LINK)
    except OSError:  # a filesystem without hard links: tools lose last.pt, resume does not
        if tmp.exists():
            tmp.unlink()


def prune(directory: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` manifested checkpoints, and orphans older than the
    newest (a state file without manifest: a save killed before it was published)."""
    sequences = _sequences(directory)
    kept = set(sequences[:max(1, keep)])
    newest = sequences[0] if sequences else 0
    for name in os.listdir(directory):
        match = re.fullmatch(r"\.?ckpt-(\d{6,})\.(json|pt)(\.tmp\d+)?", name)
        if not match or int(match.group(1)) in kept or int(match.group(1)) > newest:
            continue
        if match.group(2) == "pt" and not match.group(3) and int(match.group(1)) in sequences:
            continue  # its manifest goes first, below
        _unlink(directory / name)
    for seq in sequences:
        if seq not in kept:
            _unlink(directory / manifest_name(seq))  # first: the state is then an orphan
            _unlink(directory / state_name(seq))


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


class DirLock:
    """An exclusive lock on a checkpoint directory for one run's lifetime (rank 0's flock):
    a second run writing the same directory would interleave sequence numbers and prune the
    first run's checkpoints. Released by the kernel if the holder dies."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise CheckpointError(f"checkpoint directory {self.path.parent}: cannot write: "
                                  f"{exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise CheckpointError(f"checkpoint directory {self.path.parent} is in use by another "
                                  f"run (pid {holder}); give this run its own checkpoint_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def say(message: str) -> None:
    """One line on stderr, flushed (rank 0's voice for checkpoint news)."""
    sys.stderr.write(f"clusterddp.train: {message}\n")  # one write: the writer thread speaks too
    sys.stderr.flush()
