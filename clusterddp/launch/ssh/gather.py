"""The hosts' event logs brought to the head, so ``clusterddp report`` on the head covers the job.

Each host's launcher writes ``events.node<K>.jsonl`` in its own ``logs/<run-id>/``
(``clusterddp.events``). Where the hosts share the head's log filesystem (the usual setup, and
the test bed) that is the head's run directory already and nothing moves. A host shares it
when it sees the head's ``launcher.json`` there, byte for byte (only the head writes that
file, and it names the head's pid and host): checked once per host over the host's SSH
connection, in the background while the host's first attempt runs. Elsewhere, after each attempt, the head reads the host's file with ``cat`` over
a new channel of the same connection and keeps it as ``events.node<K>.<host>.jsonl``
(replaced whole each time: the host's file only grows), which the report merges like the
others. A host whose connection is gone keeps its file; the report then lacks its events,
and the head says so in one line.
"""

from __future__ import annotations

import os
import shlex
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Sequence

from clusterddp.atomicfile import WriteError, write_atomically
from clusterddp.launch.ssh.io import Console, RemoteLauncher
from clusterddp.protocol import LAUNCHER_FILE, events_copy_name, events_name

#: An events file bigger than this is not fetched whole (a run writes a few KiB per attempt).
MAX_BYTES = 16 << 20


class Gatherer:
    """Fetches the hosts' event logs after each attempt; remembers which hosts share the dir."""

    def __init__(self, remote_run_dir: str, local_run_dir: Path, console: Console, timeout: float) -> None:
        self.remote_run_dir = remote_run_dir
        self.local_run_dir = local_run_dir
        self.console = console
        self.timeout = timeout
        #: host name -> True when its run directory is the head's (nothing to fetch)
        self.shared: dict[str, bool] = {}
        self._looking: dict[str, Future[None]] = {}

    def look(self, launchers: Sequence[RemoteLauncher]) -> None:
        """Find out, in the background while the attempt runs, which new hosts share the head's
        directory (so a failure's restart does not wait for it)."""
        new = [lau for lau in launchers if lau.name not in self.shared and lau.name not in self._looking]
        if not new:
            return
        pool = ThreadPoolExecutor(max_workers=min(16, len(new)), thread_name_prefix="ssh-gather")
        for launcher in new:
            self._looking[launcher.name] = pool.submit(self._look, launcher)
        pool.shutdown(wait=False)

    def _look(self, launcher: RemoteLauncher) -> None:
        theirs = self._cat(launcher, os.path.join(self.remote_run_dir, LAUNCHER_FILE))
        if theirs is not None or _active(launcher):  # unknown while the connection is gone
            self.shared[launcher.name] = theirs is not None and theirs == _read(self.local_run_dir / LAUNCHER_FILE)

    def gather(self, launchers: Sequence[RemoteLauncher]) -> None:
        """Every host's file that is not already in the head's directory, in parallel; a host
        that cannot be read is named, never fatal."""
        self.look(launchers)
        for launcher in launchers:
            looking = self._looking.pop(launcher.name, None)
            if looking is not None:
                wait([looking], timeout=2 * self.timeout)
        far = [lau for lau in launchers if not self.shared.get(lau.name, False)]
        if not far:
            return
        with ThreadPoolExecutor(max_workers=min(16, len(far)), thread_name_prefix="ssh-gather") as pool:
            missed = [name for name in pool.map(self._fetch, far) if name]
        if missed:
            self.console.say(f"events of {', '.join(missed)} not gathered (kept on the host, "
                             f"{self.remote_run_dir}): the report lacks them")

    def _fetch(self, launcher: RemoteLauncher) -> str | None:
        """Copy one host's file; its name when that failed."""
        name = launcher.name
        if name not in self.shared:
            return name  # its connection went before the head could tell
        # a launcher numbered again by a restart in place keeps its first log
        first = launcher.session.launched_as
        node_rank = launcher.node_rank if first is None else first
        data = self._cat(launcher, os.path.join(self.remote_run_dir, events_name(node_rank)))
        if data is None:
            return name
        try:
            write_atomically(self.local_run_dir / events_copy_name(node_rank, name), data, durable=False)
        except WriteError:
            return name
        return None

    def _cat(self, launcher: RemoteLauncher, path: str) -> bytes | None:
        """The remote file's bytes over a new channel of the host's connection; None when the
        file or the connection is not there."""
        if not _active(launcher):
            return None
        try:
            channel = launcher.channel.get_transport().open_session(timeout=self.timeout)
            channel.settimeout(self.timeout)
            channel.exec_command(f"cat -- {shlex.quote(path)}")
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_BYTES:
                chunk = channel.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            status = channel.recv_exit_status()
            channel.close()
        except Exception:  # noqa: BLE001 (paramiko raises many kinds on a dying link)
            return None
        return b"".join(chunks) if status == 0 and size <= MAX_BYTES else None


def _active(launcher: RemoteLauncher) -> bool:
    transport = launcher.channel.get_transport() if launcher.channel is not None else None
    return transport is not None and transport.is_active()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
