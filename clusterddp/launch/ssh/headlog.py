"""The head's record of a fan-out: its own events and its restart verdict on each attempt
(``HeadLog``), and the hosts' event logs brought to it (``Gatherer``), so that ``clusterddp
report`` on the head covers the job.

The SSH head owns the run (docs/architecture.md): it writes
``logs/<run-id>/events.jsonl`` on the head (``run_start``, each ``attempt_start`` and
``attempt_end`` with its verdict, ``restart``, ``stop``, ``run_end``), while every host's
launcher writes ``events.node<K>.jsonl`` in its own log directory (gathered by ``Gatherer``
where that is not the head's). ``clusterddp report`` merges them.

The verdict is the one-node launcher's (``launch/restart/verdict.py``), applied to the root cause
across hosts: the failed worker's exit, signal and traceback come in its host's result
line, whether any rank completed a step in every host's (``protocol.result_line``), the
previous attempt's failure is remembered here. A failure that will repeat is not restarted,
with the same ``not restarting: ...`` line as on one node.

Gathering. Each host's launcher writes ``events.node<K>.jsonl`` in its own ``logs/<run-id>/``
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
import re
import shlex
import socket
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Sequence

from clusterddp.atomicfile import WriteError, write_atomically
from clusterddp.codetree.transfer import CodePlan
from clusterddp.events import EventLog
from clusterddp.launch.observe.runlog import process_start_time
from clusterddp.launch.restart.policy import RestartPolicy, end_reason
from clusterddp.launch.restart.verdict import Failure, verdict
from clusterddp.launch.ssh.io import Console, RemoteLauncher
from clusterddp.launch.ssh.outcome import Outcome, attempt_failure, progressed, rank_ends, verdict_failure
from clusterddp.protocol import LAUNCHER_FILE, events_copy_name, events_name
from clusterddp.spec import JobSpec

#: The uncommitted diff of a shipped tree, beside the head's events file.
CODE_DIFF = "code.diff"
#: An events file bigger than this is not fetched whole (a run writes a few KiB per attempt).
MAX_BYTES = 16 << 20


class Gatherer:
    """Fetches the hosts' event logs after each attempt; remembers which hosts share the dir."""

    def __init__(self, remote_run_dir: str, local_run_dir: Path, console: Console, timeout: float) -> None:
        #: The hosts' run directory; a relative one is taken from each launcher's working
        #: directory (the head's, or the host's shipped code tree).
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
        theirs = self._cat(launcher, os.path.join(self._dir(launcher), LAUNCHER_FILE))
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
        data = self._cat(launcher, os.path.join(self._dir(launcher), events_name(node_rank)))
        if data is None:
            return name
        try:
            write_atomically(self.local_run_dir / events_copy_name(node_rank, name), data, durable=False)
        except WriteError:
            return name
        return None

    def _dir(self, launcher: RemoteLauncher) -> str:
        return os.path.join(launcher.plan.cwd, self.remote_run_dir)

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


class HeadLog:
    """The head's event log (opened once the first attempt is about to start) and verdicts."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.events: EventLog | None = None
        self._previous: Failure | None = None
        self._previous_number: int | None = None

    def open(self, run_dir: str, hosts: Sequence[str]) -> None:
        """Start the head's ``events.jsonl`` in ``run_dir`` (once) with ``run_start``."""
        if self.events is not None:
            return
        self.events = EventLog(run_dir, None, socket.gethostname())
        self.emit("run_start", job=self.job.name, hosts=list(hosts), restarts=self.job.restarts,
                  hang_timeout=self.job.hang_timeout, process_start=process_start_time())

    def code_shipped(self, code: CodePlan, cwds: Sequence[str]) -> None:
        """The ``code`` event: the tree's hash, the git commit, whether there were uncommitted
        changes; the diff itself (scrubbed by ``gitstate``) beside the log as ``code.diff`` (an
        event line is cut at 2 KiB)."""
        if self.events is None or self.events.path is None:
            return
        git = code.git
        diff = None
        if git.dirty:
            text = git.diff + "".join(f"untracked, shipped: {name}\n" for name in git.untracked)
            try:
                write_atomically(Path(self.events.path).with_name(CODE_DIFF), text.encode(), durable=False)
                diff = CODE_DIFF
            except WriteError:
                diff = None
        self.emit("code", tree=code.tree.digest, files=len(code.tree.entries), bytes=code.tree.size,
                  git_commit=git.commit, dirty=git.dirty, diff=diff, workdir=sorted(set(cwds))[0] if cwds else None)

    def emit(self, kind: str, **fields: object) -> None:
        if self.events is not None:
            self.events.emit(kind, **fields)

    def attempt_started(self, number: int, hosts: Sequence[str], ranks: int) -> None:
        if self.events is not None:
            self.events.attempt = number
        self.emit("attempt_start", ranks=ranks, hosts=list(hosts))

    def judge(self, outcome: Outcome, number: int) -> tuple[str | None, str | None]:
        """``verdict.verdict`` on the attempt's failure, from every host's ranks: why it will
        repeat (the rest of ``not restarting: ...``), or why a failure that looked
        deterministic is restarted (``restarting: ...``: it hit some ranks only).

        Remembers the failure for the next attempt's judgement ("the same ... as in attempt N").
        """
        failure = verdict_failure(outcome)
        said = verdict(failure, progressed(outcome.launchers), self._previous, self._previous_number,
                       self.job.restart_on, rank_ends(outcome.launchers)) if failure is not None else (None, None)
        self._previous, self._previous_number = failure, number
        return said

    def attempt_ended(self, number: int, outcome: Outcome, backoff: float | None, repeat: str | None,
                      stopping: str | None) -> None:
        """``attempt_end`` with its verdict and why; ``stop`` before it and ``restart`` after, as
        they apply."""
        if self.events is None:
            return
        # judge() has just read this attempt's failure; read it again only if it was not asked
        failure = self._previous if self._previous_number == number else verdict_failure(outcome)
        code = outcome.exit_code
        cause = (outcome.root.result or {}).get("root_cause") if outcome.root is not None else None
        why = repeat or end_reason(RestartPolicy(self.job.restarts), number, code or None, stopping)
        self.events.attempt_ended(code, attempt_failure(outcome), failure.name() if failure is not None else None,
                                  (cause or {}).get("at") or (outcome.root.failed_at if outcome.root else None),
                                  backoff, why, stopping)

    def close(self, exit_code: int | None) -> None:
        """``run_end`` with the head's exit code (None: the head is leaving on an error, no
        ``run_end``), and the file closed; later calls do nothing."""
        if exit_code is not None:
            self.emit("run_end", exit_code=exit_code)
        if self.events is not None:
            self.events.close()
            self.events = None
