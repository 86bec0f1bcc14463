"""The run: relay every host's output, send heartbeats, and stop every host on any failure.

One thread (the caller's) serves all hosts through a selector on the channels, so what the
head spends per host is one paramiko transport thread plus a few syscalls per line relayed.

Teardown is layered, each layer covering the failure of the one before:

1. the head closes each launcher's stdin (EOF): the launcher stops its workers and reports;
2. hosts still running ``grace + 2`` s later get ``kill -TERM -- -PGID`` over a new channel
   (or a new connection), then ``-KILL`` 2 s after that;
3. a host the head cannot reach stops on its own: its launcher sees no heartbeat for 6 s;
4. a ``kill -9`` of the head closes its sockets, which the hosts see as EOF (layer 1).

Stacks travel the same channels: the head writes ``protocol.STACKS_REQUEST_BYTE`` to every
host's stdin, each host's launcher answers with one ``CLUSTERDDP_STACKS`` line, and
``ssh.stacks`` merges the answers. When a host reports a hang, teardown waits (at most ``HANG_WAIT``) until the other
hosts said where their ranks are, so the report can name the rank holding everyone.
"""

from __future__ import annotations

import json
import selectors
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from clusterddp import exitcodes
from clusterddp.launch.ssh.connect import USER_TIMEOUT_MS, ConnectError, ConnectSettings, open_client
from clusterddp.launch.ssh.preflight import HostSession
from clusterddp.launch.ssh.remote_command import LaunchPlan, kill_command
from clusterddp.launch.ssh.stacks import HANG_WAIT, REQUEST_WAIT, StacksRound
from clusterddp.protocol import (REMOTE_BLOCK_HEADER, RESULT_MARKER, STACKS_MARKER, STACKS_REQUEST_BYTE,
                                 parse_result, parse_stacks, write_stacks_report)
from clusterddp.stackreport import HostStacks

#: Exit code when a host is lost (ssh's own convention for connection errors).
HOST_LOST = 255
KILL_MARGIN = 2.0


@dataclass
class RemoteLauncher:
    """The launcher on one host, as the head sees it."""

    session: HostSession
    plan: LaunchPlan
    log: BinaryIO
    result: dict[str, Any] | None = None
    exit_status: int | None = None
    lost: str | None = None
    #: Wall-clock time of this host's failure as far as the head can tell.
    failed_at: float | None = None
    done: bool = False
    eof_sent: bool = False
    partial: dict[str, bytes] = field(default_factory=lambda: {"out": b"", "err": b""})
    #: Inside the launcher's own stderr block about a dump (kept out of the console).
    in_stacks_block: bool = False

    @property
    def name(self) -> str:
        return self.session.host.name

    @property
    def channel(self) -> Any:
        return self.session.channel

    @property
    def exit_code(self) -> int | None:
        if self.lost:
            return HOST_LOST
        if self.result is not None:
            return int(self.result.get("exit_code", 1))
        if self.exit_status is not None:
            return self.exit_status if self.exit_status >= 0 else HOST_LOST
        return None

    def failed(self) -> bool:
        code = self.exit_code
        return code is not None and code != 0


@dataclass
class Outcome:
    """How the run ended: exit code, the host blamed first, and why the head stopped it."""

    exit_code: int
    root: RemoteLauncher | None
    stop_reason: str | None
    launchers: list[RemoteLauncher]
    seconds: float


class Relay:
    """Drives all launchers from GO to the end; see the module docstring for teardown."""

    def __init__(self, launchers: list[RemoteLauncher], stdout: BinaryIO, stderr: BinaryIO,
                 settings: ConnectSettings, grace_period: float, heartbeat_interval: float = 1.0,
                 log_dir: Path | None = None) -> None:
        self.launchers = launchers
        self.stdout = stdout
        self.stderr = stderr
        self.settings = settings
        self.grace_period = grace_period
        self.heartbeat_interval = heartbeat_interval
        self.stop_reason: str | None = None
        self.stop_signal: int | None = None
        self._teardown_at: float | None = None
        self._term_sent = False
        self._kill_sent = False
        self._killers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ssh-kill")
        self._lock = threading.Lock()
        #: Where the merged stacks reports go (the run's log dir on the head).
        self.log_dir = log_dir
        self._stacks_wanted = False
        self._round: StacksRound | None = None
        #: The first host that reported a hang, and whether its merged report is out.
        self.hang_host: RemoteLauncher | None = None
        self._hang_reported = False

    def request_stop(self, reason: str, signum: int | None = None) -> None:
        """Stop every host (safe from a signal handler: the loop acts on it)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stop_signal = signum

    def request_stacks(self) -> None:
        """Ask every host for its ranks' stacks (safe from a signal handler: the loop acts)."""
        self._stacks_wanted = True

    def run(self) -> Outcome:
        start = time.monotonic()
        selector = selectors.DefaultSelector()
        for launcher in self.launchers:
            launcher.channel.sendall(json.dumps(launcher.plan.message()).encode() + b"\n")
            selector.register(launcher.channel.fileno(), selectors.EVENT_READ, launcher)
        next_beat = time.monotonic() + self.heartbeat_interval
        try:
            while any(not lau.done for lau in self.launchers):
                selector.select(timeout=0.1)
                for launcher in self.launchers:
                    if not launcher.done:
                        self._drain(launcher)
                        if self._ended(launcher):
                            selector.unregister(launcher.channel.fileno())
                self._stacks_step(time.monotonic())
                self._decide()
                now = time.monotonic()
                if self._teardown_at is None and now >= next_beat:
                    self._heartbeat()
                    next_beat = now + self.heartbeat_interval
                if self._teardown_at is not None and self._escalate(now):
                    break
            self._close_stacks()
        finally:
            selector.close()
            self._killers.shutdown(wait=False, cancel_futures=True)
            self._flush_partials()
        return self._outcome(time.monotonic() - start)

    # -- output ----------------------------------------------------------------------------

    def _drain(self, launcher: RemoteLauncher) -> None:
        channel = launcher.channel
        while channel.recv_ready():
            self._lines(launcher, "out", channel.recv(65536))
        while channel.recv_stderr_ready():
            self._lines(launcher, "err", channel.recv_stderr(65536))

    def _lines(self, launcher: RemoteLauncher, stream: str, data: bytes) -> None:
        data = launcher.partial[stream] + data
        *lines, launcher.partial[stream] = data.split(b"\n")
        for line in lines:
            self._line(launcher, stream, line + b"\n")

    def _line(self, launcher: RemoteLauncher, stream: str, line: bytes) -> None:
        launcher.log.write(line)
        if stream == "out" and line.startswith(STACKS_MARKER):
            self._stacks_answer(launcher, line)
            return
        if stream == "err" and self._in_stacks_block(launcher, line):
            return
        if stream == "out" and line.startswith(RESULT_MARKER):
            try:
                launcher.result = parse_result(line)
            except ValueError:
                launcher.result = {"exit_code": 1, "root_cause": None, "reason": "unreadable result line"}
            if launcher.failed() and launcher.failed_at is None:
                launcher.failed_at = time.time()
            if launcher.exit_code == exitcodes.HANG and self.hang_host is None:
                self.hang_host = launcher
            return
        if not line.startswith(b"["):  # the launcher's own messages: say which host they come from
            line = f"[{launcher.name}] ".encode() + line
        out = self.stdout if stream == "out" else self.stderr
        out.write(line)
        out.flush()

    def _flush_partials(self) -> None:
        for launcher in self.launchers:
            for stream, rest in launcher.partial.items():
                if rest:
                    self._line(launcher, stream, rest + b"\n")
                    launcher.partial[stream] = b""

    # -- state -----------------------------------------------------------------------------

    def _ended(self, launcher: RemoteLauncher) -> bool:
        channel = launcher.channel
        transport = channel.get_transport()
        if not channel.exit_status_ready() and transport is not None and transport.is_active():
            return False
        if channel.recv_ready() or channel.recv_stderr_ready():
            return False
        status = channel.recv_exit_status()
        if status == -1 and (transport is None or not transport.is_active()):
            launcher.lost = ("connection lost (no TCP acknowledgement for "
                             f"{USER_TIMEOUT_MS / 1000:.0f}s: link down or host dead?)")
            # The link stopped acknowledging about USER_TIMEOUT before the kernel gave up.
            launcher.failed_at = time.time() - USER_TIMEOUT_MS / 1000
        else:
            launcher.exit_status = status
            if launcher.failed() and launcher.failed_at is None:
                launcher.failed_at = time.time()
            if launcher.exit_code == exitcodes.HANG and self.hang_host is None:
                self.hang_host = launcher
        launcher.done = True
        return True

    def _decide(self) -> None:
        if self.stop_reason is not None:
            self._begin_teardown()
            return
        if self.hang_host is not None and not self._hang_reported:
            return  # the other hosts are being asked where their ranks are; _stacks_step stops the job
        for launcher in self.launchers:
            if launcher.failed() and not launcher.eof_sent:
                what = launcher.lost or f"exit code {launcher.exit_code}"
                self.request_stop(f"{launcher.name} failed ({what})")
                self._begin_teardown()
                return

    def _heartbeat(self) -> None:
        for launcher in self.launchers:
            if not launcher.done:
                try:
                    launcher.channel.send(b"\n")
                except (OSError, EOFError, Exception):  # noqa: BLE001 (a dead transport raises various)
                    pass  # a dead connection is noticed by _ended; the host's own heartbeat check stops it

    def _begin_teardown(self) -> None:
        if self._teardown_at is not None:
            return
        self._teardown_at = time.monotonic()
        for launcher in self.launchers:
            if not launcher.done:
                launcher.eof_sent = True
                try:
                    launcher.channel.shutdown_write()
                except (OSError, EOFError, Exception):  # noqa: BLE001
                    pass

    def _escalate(self, now: float) -> bool:
        """Kill stragglers by process group; True when it is time to give up waiting."""
        assert self._teardown_at is not None
        waited = now - self._teardown_at
        running = [lau for lau in self.launchers if not lau.done]
        if not self._term_sent and waited > self.grace_period + KILL_MARGIN:
            self._term_sent = True
            for launcher in running:
                self._killers.submit(self._kill, launcher, "TERM")
        if not self._kill_sent and waited > self.grace_period + 2 * KILL_MARGIN:
            self._kill_sent = True
            for launcher in running:
                self._killers.submit(self._kill, launcher, "KILL")
        return waited > self.grace_period + 3 * KILL_MARGIN + self.settings.timeout

    def _kill(self, launcher: RemoteLauncher, signal_name: str) -> None:
        """``kill -SIG -- -PGID`` over a second channel (or a fresh connection if needed)."""
        facts = launcher.session.facts
        command = kill_command(facts["pid"], facts["pgid"], signal_name)
        transport = launcher.channel.get_transport()
        client = None
        try:
            if transport is None or not transport.is_active():
                client = open_client(launcher.session.host, self.settings)
                transport = client.get_transport()
            channel = transport.open_session(timeout=self.settings.timeout)
            channel.exec_command(command)
            channel.recv_exit_status()
            channel.close()
            self._say(f"sent SIG{signal_name} to the launcher's process group on {launcher.name}")
        except (ConnectError, OSError, EOFError, Exception) as exc:  # noqa: BLE001
            self._say(f"could not reach {launcher.name} to stop it ({exc}); it stops on its own when "
                      "the heartbeat stops")
        finally:
            if client is not None:
                client.close()

    def _say(self, message: str) -> None:
        with self._lock:
            self.stderr.write(f"clusterddp: {message}\n".encode())
            self.stderr.flush()

    # -- stacks across hosts ---------------------------------------------------------------

    def _in_stacks_block(self, launcher: RemoteLauncher, line: bytes) -> bool:
        """The launcher's own stderr lines about a dump: the merged report replaces them."""
        if line.startswith(REMOTE_BLOCK_HEADER):
            launcher.in_stacks_block = True
            return True
        if launcher.in_stacks_block and line.startswith(b"  "):
            return True
        launcher.in_stacks_block = False
        return False

    def _stacks_answer(self, launcher: RemoteLauncher, line: bytes) -> None:
        try:
            stacks = HostStacks.from_json(parse_stacks(line), host=launcher.name)
        except (ValueError, TypeError, AttributeError):
            self._say(f"unreadable stacks line from {launcher.name}")
            return
        if stacks.why == "hang" and self.hang_host is None:
            self.hang_host = launcher
            if self._round is not None:
                self._round.trigger = launcher.name
        if self._round is None and stacks.why == "hang":
            self._open_round("hang", HANG_WAIT, trigger=launcher.name)
        if self._round is not None:
            self._round.answer(stacks)

    def _open_round(self, why: str, wait: float, trigger: str | None = None) -> None:
        now = time.monotonic()
        self._round = StacksRound(why=why, started=now, deadline=now + wait, asked=[], trigger=trigger)
        for launcher in self.launchers:
            if launcher.done or launcher.name == trigger:
                continue
            self._round.asked.append(launcher.name)
            try:
                launcher.channel.send(STACKS_REQUEST_BYTE)
            except Exception:  # noqa: BLE001 (a dead transport raises various; the round times out)
                pass

    def _stacks_step(self, now: float) -> None:
        """Open a round when asked or when a host hung; close it when complete or overdue."""
        if self._round is None:
            if self.hang_host is not None and not self._hang_reported:
                self._open_round("hang", HANG_WAIT, trigger=self.hang_host.name)
            elif self._stacks_wanted and self._teardown_at is None:
                self._stacks_wanted = False
                self._open_round("requested", REQUEST_WAIT)
            else:
                return
        assert self._round is not None
        if self.hang_host is not None and self._round.why != "hang":
            self._round.why = "hang"
            self._round.deadline = min(self._round.deadline, now + HANG_WAIT)
        live = {lau.name for lau in self.launchers if not lau.done}
        if self._round.finished(now, live):
            self._finish_round(self._round)
            self._round = None

    def _close_stacks(self) -> None:
        """Every host has ended: report what a round still open (or a hang) has by now."""
        if self._round is None and self.hang_host is not None and not self._hang_reported:
            self._open_round("hang", 0.0, trigger=self.hang_host.name)
        if self._round is not None:
            self._finish_round(self._round)
            self._round = None

    def _finish_round(self, round_: StacksRound) -> None:
        merged = round_.merged()
        title = round_.title(len(self.launchers))
        lines = [f"clusterddp: {title}"] + [f"  {line}" for line in merged.lines()]
        if self.log_dir is not None and round_.answers:
            path = Path(write_stacks_report(merged.text(title), self.log_dir)).resolve()
            lines.append(f"  summary and each host's full-dump path: {path}")
        with self._lock:
            self.stderr.write(("\n".join(lines) + "\n").encode())
            self.stderr.flush()
        if round_.why == "hang":
            self._hang_reported = True
            host = self.hang_host.name if self.hang_host else round_.trigger
            self.request_stop(f"hang: no rank on {host} made progress for its hang_timeout; {merged.culprit()}")

    # -- the end -------------------------------------------------------------------------

    def _outcome(self, seconds: float) -> Outcome:
        if self.hang_host is not None:
            # Whatever failed after a hang (peers of the stopped ranks lose their connections)
            # is a consequence; the hang is the cause and its exit code the job's.
            return Outcome(exit_code=exitcodes.HANG, root=self.hang_host, stop_reason=self.stop_reason,
                           launchers=self.launchers, seconds=seconds)
        root = self._root_cause()
        if root is not None:
            code = root.exit_code or 1
        elif self.stop_signal is not None:
            code = 128 + self.stop_signal
        elif any(lau.failed() or not lau.done for lau in self.launchers):
            code = next((lau.exit_code for lau in self.launchers if lau.failed()), None) or 1
        else:
            code = 0
        return Outcome(exit_code=code, root=root, stop_reason=self.stop_reason, launchers=self.launchers,
                       seconds=seconds)

    def _root_cause(self) -> RemoteLauncher | None:
        """The host that failed first, by the time each failure happened.

        A worker's failure carries its own wall-clock time (``root_cause.at``, hosts' clocks
        are assumed NTP-close); a lost host counts from when its link stopped acknowledging.
        Hosts the head was already stopping are not causes: their exits are consequences.
        """
        candidates: list[tuple[float, RemoteLauncher]] = []
        for launcher in self.launchers:
            if not launcher.failed():
                continue
            cause = (launcher.result or {}).get("root_cause")
            if cause and not cause.get("stopped_by_us"):
                candidates.append((float(cause.get("at") or launcher.failed_at or 0.0), launcher))
            elif not launcher.eof_sent or launcher.lost:
                candidates.append((launcher.failed_at or time.time(), launcher))
        if not candidates:
            return None
        return min(candidates, key=lambda c: c[0])[1]


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum else ""
