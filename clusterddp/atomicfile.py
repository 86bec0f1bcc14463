"""Files written for the user are whole or not written at all.

``path.write_text`` truncates the old file first: on a full disk, a quota or a crash the user
is left with half a script where a good one was (``render slurm -o`` left 4096 bytes that
``bash -n`` refused). Here the text goes to a temporary file in the same directory, is
fsync-ed, then renamed over the target (atomic on POSIX); on any failure the temporary file
is removed and the old file is untouched. Worker logs are streams and do not come here.
"""

from __future__ import annotations

import os
import secrets
import stat

from clusterddp.errors import ClusterDDPError
from clusterddp.validate import path_problem, shown


def output_path(path: str, command: str) -> str:
    """The file a user names with ``-o`` (``pack``, ``render``), refused before anything is
    made when it is not one bounded line: a newline or an escape in it would reach the
    "wrote PATH" line and the printed follow-up commands raw. One rule for every ``-o``."""
    problem = path_problem(path)
    if problem:
        raise ClusterDDPError(f"{command}: -o: {problem}")
    return path


class WriteError(ClusterDDPError):
    """A file could not be written; the old one (if any) is unchanged. Names the path."""

    def __init__(self, path: str, strerror: str) -> None:
        super().__init__(f"{shown(path)}: cannot write: {strerror}")
        self.path = path
        self.strerror = strerror


def write_atomically(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None,
                     durable: bool = True) -> None:
    """Replace ``path`` by ``data`` (text is UTF-8) in one rename; raise WriteError otherwise.

    ``mode``: the new file's permissions; None keeps the old file's, or gives a new file
    ``0o666`` less the umask, as ``open()`` would. A symlink is followed (its target is
    replaced, the link stays). A target that exists and is not a regular file (``/dev/stdout``,
    a FIFO) cannot be replaced, so it is written in place. ``durable=False`` skips the fsyncs,
    for bookkeeping files that are worthless after a crash anyway.
    """
    name = os.fspath(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    target = os.path.realpath(name)
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise WriteError(name, exc.strerror or type(exc).__name__) from None
    if old is not None and not stat.S_ISREG(old.st_mode):
        _write_in_place(name, target, payload, old)
        return
    keep = mode if mode is not None else (stat.S_IMODE(old.st_mode) if old is not None else None)
    directory, base = os.path.split(target)
    tmp = os.path.join(directory, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # 0o666 as open() uses: the kernel applies the umask (no thread-unsafe os.umask dance).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise WriteError(name, exc.strerror or type(exc).__name__) from None
    try:
        try:
            if keep is not None:
                os.fchmod(fd, keep)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            kept = "; the old file is unchanged" if old is not None else ""
            raise WriteError(name, (exc.strerror or type(exc).__name__) + kept) from None
        raise
    if durable:
        fsync_dir(directory)


def _write_in_place(name: str, target: str, payload: bytes, old: os.stat_result) -> None:
    """A device or FIFO: there is no old content to keep, and no rename that would reach it."""
    if stat.S_ISDIR(old.st_mode):
        raise WriteError(name, "Is a directory")
    try:
        with open(target, "wb") as f:
            f.write(payload)
    except OSError as exc:
        raise WriteError(name, exc.strerror or type(exc).__name__) from None


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename durable: the directory entry lives in the directory's own blocks. Some
    filesystems (certain network mounts) refuse fsync on a directory, which is fine."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def append_whole(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Append ``data`` (a line to a file others append to as well, e.g. known_hosts) whole or
    not at all: a short or failed write is cut back to the old end; raise WriteError.

    Appending (not replacing) keeps other writers' lines: OpenSSH appends to the same file."""
    name = os.fspath(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise WriteError(name, exc.strerror or type(exc).__name__) from None
    try:
        end = os.fstat(fd).st_size
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass
            raise WriteError(name, (exc.strerror or type(exc).__name__) + "; the file is unchanged") from None
    finally:
        os.close(fd)
