"""The head's I/O with every host: each launcher's channel read line by line, its lines
relayed to the console, keepalives and requests written to its stdin, its end noticed.

What the lines mean (result and stacks lines, hangs) is the relay's business; this module
only moves bytes and records what a channel says about its host in ``HostState``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, BinaryIO, Callable, Sequence

from clusterddp.launch.observe.merge import LineMerger, Source, parse_label, ranks_label

from clusterddp.launch.ssh.outcome import HostState
from clusterddp.launch.ssh.reach import HostSession, LaunchPlan, user_timeout_ms
from clusterddp.protocol import REMOTE_BLOCK_HEADER, parse_result, restart_word
from clusterddp.redact import mask

#: ``(launcher, "out" | "err", line ending in a newline)``
LineHandler = Callable[["RemoteLauncher", str, bytes], None]


class RemoteLauncher(HostState):
    """The launcher on one host, as the head sees it: its state plus its session and log."""

    def __init__(self, session: HostSession, plan: LaunchPlan, log: "HostLog") -> None:
        super().__init__(name=session.host.name, address=session.host.address, node_rank=plan.node_rank)
        self.session = session
        self.plan = plan
        #: The head's copy of everything the host wrote.
        self.log = log
        #: What arrived after the last newline, per stream.
        self.partial: dict[str, bytes] = {"out": b"", "err": b""}
        #: Inside the launcher's own stderr block about a dump (kept out of the console).
        self.in_stacks_block = False
        #: The head closed the launcher's stdin (EOF): no keepalive or word can follow.
        self.stdin_closed = False
        #: The session is over (the launcher exited, or the connection is lost).
        self.over = False

    @property
    def channel(self) -> Any:
        return self.session.channel


class HostLog:
    """The head's copy of one host's output (``ssh-<host>.log``): best effort, as a rank's log
    is (observe/logs.py). A file that cannot be opened or written (a full disk, EIO, a
    read-only directory) is dropped with one line on the console; the run goes on, the
    host's own logs and the console keep its output."""

    def __init__(self, path: str, console: "Console") -> None:
        self.path = path
        self.console = console
        self.file: BinaryIO | None = None
        try:
            self.file = open(path, "ab")
        except OSError as exc:
            self._drop(exc)

    def write(self, data: bytes) -> int:
        if self.file is not None:
            try:
                self.file.write(data)
            except OSError as exc:
                self._drop(exc)
        return len(data)

    def close(self) -> None:
        file, self.file = self.file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass  # what was still buffered is lost with the disk that could not take it

    def _drop(self, exc: OSError) -> None:
        self.close()
        self.console.say(f"warning: cannot write {self.path} ({exc.strerror or exc}): the head's copy of that "
                         "host's output stops here; the run goes on")


class Console:
    """The head's stdout and stderr, shared by the relay loop and the kill threads: every
    line the head prints (relayed from a host, its own messages and report) is masked of the
    secrets it forwards (``redact.mask``): a host's launcher masks its own lines, but a line
    cut or joined differently, or a launcher that knew fewer secrets, leaks nothing here.

    The head sees every host, so identical worker lines of ranks on several hosts are shown
    once (``merging``); each host's launcher has already merged its own ranks' lines."""

    def __init__(self, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self._lock = threading.Lock()
        self._merger: LineMerger | None = None

    def merging(self, ranks: int) -> None:
        """Merge the relayed lines of these many ranks (this attempt's) across hosts."""
        if self._merger is None:
            self._merger = LineMerger(self._render, self._write_stream, expected=ranks)
        self._merger.expected = ranks

    def flush(self) -> None:
        """Relayed lines still held for merging go out."""
        if self._merger is not None:
            self._merger.flush()

    @staticmethod
    def _render(stderr: bool, text: bytes, sources: Sequence[Source]) -> bytes:
        """One source: its line as the host wrote it (``[cdssh1 rank 3] ``)."""
        return f"[{ranks_label(sources)}] ".encode() + text + b"\n"

    def _write_stream(self, data: bytes, stderr: bool) -> None:
        self._write(self.stderr if stderr else self.stdout, data)

    def say(self, message: str) -> None:
        """One ``clusterddp: ...`` line on stderr."""
        self.write_err(f"clusterddp: {message}\n")

    def write_err(self, text: str) -> None:
        """Whole lines of the head's own on stderr."""
        self.flush()
        self._write(self.stderr, text.encode("utf-8", "replace"))

    def write_out(self, text: str) -> None:
        """Whole lines of the head's own on stdout (the dry run)."""
        self._write(self.stdout, text.encode("utf-8", "replace"))

    def _write(self, stream: BinaryIO, data: bytes) -> None:
        """A console that cannot take the line (a detached head's console file on a full
        disk, a terminal gone) loses it, never the run (as a launcher's, observe/logs.py)."""
        with self._lock:
            try:
                stream.write(mask(data))
                stream.flush()
            except OSError:
                pass

    def relay(self, launcher: RemoteLauncher, stream: str, line: bytes) -> None:
        """A host's line on the head's matching stream; the launcher's own messages (not
        ``[rank ...]`` prefixed by its workers' relay) say which host they come from."""
        if self._merger is not None and self._merger.expected > 1:
            labelled = parse_label(line)
            if labelled is not None:
                host, ranks, text = labelled
                self._merger.add(stream == "err", host, ranks, text)
                return
            self._merger.flush()
        if not line.startswith(b"["):
            line = f"[{launcher.name}] ".encode() + line
        self._write(self.stdout if stream == "out" else self.stderr, line)


def start_hosts(launchers: Sequence[RemoteLauncher]) -> None:
    """GO to every host, one after the other with nothing in between: each stub reads its
    launcher's argv, env and directory and execs it. The relay reads what they write next."""
    for launcher in launchers:
        launcher.channel.sendall(json.dumps(launcher.plan.message()).encode() + b"\n")


def restart_hosts(launchers: Sequence[RemoteLauncher], attempt: int, master_port: int, renumbered: bool,
                  master_addr: str | None = None) -> None:
    """The restart word to every host's waiting launcher, back to back: each runs ``attempt``
    in place on ``master_port``, its workers forked from the interpreter it kept; when the
    hosts were ``renumbered``, each as its plan's node rank of the hosts' plans (with the
    master at ``master_addr`` when it moved)."""
    workers = [launcher.plan.nproc for launcher in launchers]
    for launcher in launchers:
        layout = (launcher.plan.node_rank, workers) if renumbered else None
        launcher.channel.sendall(restart_word(attempt, master_port, layout, master_addr if layout else None))


def drain(launcher: RemoteLauncher, on_line: LineHandler) -> None:
    """Read whatever the channel holds, handing on every complete line."""
    channel = launcher.channel
    while channel.recv_ready():
        _split(launcher, "out", channel.recv(65536), on_line)
    while channel.recv_stderr_ready():
        _split(launcher, "err", channel.recv_stderr(65536), on_line)


def _split(launcher: RemoteLauncher, stream: str, data: bytes, on_line: LineHandler) -> None:
    data = launcher.partial[stream] + data
    *lines, launcher.partial[stream] = data.split(b"\n")
    for line in lines:
        on_line(launcher, stream, line + b"\n")


def flush_partials(launchers: Sequence[RemoteLauncher], on_line: LineHandler) -> None:
    """The end: a last line without its newline is still a line."""
    for launcher in launchers:
        for stream, rest in launcher.partial.items():
            if rest:
                on_line(launcher, stream, rest + b"\n")
                launcher.partial[stream] = b""


def poll_end(launcher: RemoteLauncher) -> bool:
    """True once the host's session is over and read to the end; records its exit or loss."""
    channel = launcher.channel
    if alive(launcher) or channel.recv_ready() or channel.recv_stderr_ready():
        return False
    status = channel.recv_exit_status()
    transport = channel.get_transport()
    if status == -1 and (transport is None or not transport.is_active()):
        silent = user_timeout_ms(launcher.session.link_timeout) / 1000  # what its socket was given
        launcher.lost = lost_reason(silent)
        # The link stopped acknowledging at least the link timeout before the kernel gave up
        # (Linux counts it from its first resend, one retransmission timeout later still).
        launcher.failed_at = time.time() - silent
    else:
        launcher.exit_status = status
        if launcher.failed() and launcher.failed_at is None:
            launcher.failed_at = time.time()
    launcher.done = launcher.over = True
    return True


def lost_reason(link_timeout: float) -> str:
    """Why a host whose connection died is lost: its socket's link timeout ran out (``1s``, ``0.5s``)."""
    return f"connection lost (no TCP acknowledgement for {link_timeout:g}s: link down or host dead?)"


def waiting(launcher: RemoteLauncher) -> bool:
    """The launcher reported a failed attempt and waits for the head's word (its session
    still open, as far as the head knows): it has ended this attempt."""
    return launcher.waits and not launcher.stdin_closed and not launcher.over


def alive(launcher: RemoteLauncher) -> bool:
    """Its session still runs: no exit status, and the connection is up."""
    channel = launcher.channel
    transport = channel.get_transport()
    return not channel.exit_status_ready() and transport is not None and transport.is_active()


def read_result(launcher: RemoteLauncher, line: bytes) -> None:
    """The launcher's result line; an unreadable one is a failure."""
    try:
        launcher.result = parse_result(line)
    except ValueError:
        launcher.result = {"exit_code": 1, "root_cause": None, "reason": "unreadable result line"}
    if launcher.failed() and launcher.failed_at is None:
        launcher.failed_at = time.time()


def in_stacks_block(launcher: RemoteLauncher, line: bytes) -> bool:
    """The launcher's own stderr lines about a dump: the merged report replaces them."""
    if line.startswith(REMOTE_BLOCK_HEADER):
        launcher.in_stacks_block = True
        return True
    if launcher.in_stacks_block and line.startswith(b"  "):
        return True
    launcher.in_stacks_block = False
    return False


def keepalive(launchers: Sequence[RemoteLauncher]) -> None:
    """A newline down every launcher's stdin still open (running, or waiting for the head's
    word): it stops when these stop coming."""
    for launcher in launchers:
        if not launcher.stdin_closed and not launcher.over:
            send(launcher, b"\n")


def send(launcher: RemoteLauncher, data: bytes) -> None:
    try:
        launcher.channel.send(data)
    except (OSError, EOFError, Exception):  # noqa: BLE001 (a dead transport raises various)
        pass
