"""The run: relay every host's output, send keepalives, and stop every host on any failure.

One thread (the caller's) serves all hosts through a selector on the channels, so what the
head spends per host is one paramiko transport thread plus a few syscalls per line relayed.
``Relay`` coordinates; each job has its module:

- ``io``: each host's channel read line by line, lines relayed, keepalives sent, its end noticed;
- ``Teardown`` (below): stopping every host (stdin closed, then a process-group kill over SSH);
- ``outcome``: the job's exit code and root cause across hosts, and the report, pure functions over plain data;
- ``stacks``: one round of "where is each rank" across hosts.

Teardown is layered, each layer covering the failure of the one before (``Teardown`` runs
layers 1 and 2):

1. the head closes each launcher's stdin (EOF), after a byte naming the signal when it got
   one: the launcher stops its workers (with that signal, as a launcher that got it) and reports;
   when the job will be restarted in place (``in_place``: restarts left, the launchers started
   with ``--await-restart``), a failure instead sends the end word (``protocol.end_attempt_word``):
   each launcher tears down its workers, reports, and waits for the head's word with its zygote
   (a waiting launcher counts as done for the attempt); a stop signal after that still closes
   every stdin, the waiting launchers' too;
2. hosts still running ``grace + 2`` s later get ``kill -TERM -- -PGID`` over a new channel
   (or a new connection), then ``-KILL`` 2 s after that;
3. a host the head cannot reach stops on its own: its launcher sees no keepalive for 6 s;
4. a ``kill -9`` of the head closes its sockets, which the hosts see as EOF (layer 1).

Stacks travel the same channels: the head writes ``protocol.STACKS_REQUEST_BYTE`` to every
host's stdin, each host's launcher answers with one ``CLUSTERDDP_STACKS`` line, and
``ssh.stacks`` merges the answers. When a host reports a hang, teardown waits (at most ``HANG_WAIT``) until the other
hosts said where their ranks are, so the report can name the rank holding everyone.

The slow host is named here too: each host's launcher sends its ranks' progress files that
changed (``CLUSTERDDP_PROGRESS``, at most every 0.5 s), and the head, which sees every host,
compares all ranks (``straggler.StragglerWatch``): one line and one event per slow host.
"""

from __future__ import annotations

import selectors
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from clusterddp import exitcodes
from clusterddp.atomicfile import WriteError
from clusterddp.launch.ssh import io
from clusterddp.launch.ssh.io import Console, RemoteLauncher
from clusterddp.launch.ssh.outcome import Outcome, failure_reason, job_result, unhandled_failure
from clusterddp.launch.ssh.reach import ConnectError, ConnectSettings, kill_command, open_client
from clusterddp.launch.ssh.stacks import HANG_WAIT, REQUEST_WAIT, StacksRound
from clusterddp.events import EventLog
from clusterddp.progress import RankProgress, parse_record
from clusterddp.protocol import (PROGRESS_MARKER, RESULT_MARKER, STACKS_MARKER, STACKS_REQUEST_BYTE,
                                 end_attempt_word, parse_progress, parse_stacks, stop_request_byte,
                                 write_stacks_report)
from clusterddp.stackreport import HostStacks
from clusterddp.straggler import StragglerWatch

#: Seconds between the teardown's layers: EOF, then ``grace + KILL_MARGIN`` TERM, then KILL.
KILL_MARGIN = 2.0


class Relay:
    """Drives all launchers from GO (``io.start_hosts``, the head's step before the relay) to
    the end; see the module docstring for teardown."""

    def __init__(self, launchers: list[RemoteLauncher], console: Console,
                 settings: ConnectSettings, grace_period: float, keepalive_interval: float = 1.0,
                 log_dir: Path | None = None, events: EventLog | None = None,
                 in_place: int | None = None) -> None:
        self.launchers = launchers
        #: The attempt, when a failure ends it on every host rather than stopping the hosts
        #: (the job has restarts left and its launchers wait for the head's word).
        self.in_place = in_place
        self.console = console
        self.keepalive_interval = keepalive_interval
        self.stop_reason: str | None = None
        self.stop_signal: int | None = None
        self.stop_began: float | None = None
        self.teardown = Teardown(settings, grace_period, self.console)
        #: Where the merged stacks reports go (the run's log dir on the head).
        self.log_dir = log_dir
        self._stacks_wanted = False
        self._round: StacksRound | None = None
        #: The first host that reported a hang, and whether its merged report is out.
        self.hang_host: RemoteLauncher | None = None
        self._hang_reported = False
        self._stragglers = StragglerWatch()
        self._rank_hosts: dict[int, str] = {}
        #: Every rank's latest progress file, from the hosts' progress lines.
        self._records: dict[int, RankProgress] = {}
        #: The head's event log (``ssh.headlog``: one writer of events.jsonl); None: one of
        #: its own is opened on the first straggler.
        self._events: EventLog | None = events

    def request_stop(self, reason: str, signum: int | None = None) -> None:
        """Stop every host (safe from a signal handler: the loop acts on it). A stop signal
        after a failure is kept too: the hosts then stop, not only the attempt."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stop_signal = signum
            self.stop_began = time.monotonic()
        elif signum is not None and self.stop_signal is None:
            self.stop_signal = signum

    def request_stacks(self) -> None:
        """Ask every host for its ranks' stacks (safe from a signal handler: the loop acts)."""
        self._stacks_wanted = True

    def run(self) -> Outcome:
        start = time.monotonic()
        selector = selectors.DefaultSelector()
        for launcher in self.launchers:
            selector.register(launcher.channel.fileno(), selectors.EVENT_READ, launcher)
        next_beat = time.monotonic() + self.keepalive_interval
        try:
            while any(not lau.done for lau in self.launchers):
                selector.select(timeout=0.1)
                for launcher in self.launchers:
                    if not launcher.over:  # a waiting launcher is read on: its end is noticed
                        io.drain(launcher, self._line)
                        if self._ended(launcher):
                            selector.unregister(launcher.channel.fileno())
                    launcher.done = launcher.over or io.waiting(launcher)
                self._stacks_step(time.monotonic())
                self._decide()
                now = time.monotonic()
                if now >= next_beat:  # to every open stdin, the waiting launchers' too
                    io.keepalive(self.launchers)
                    next_beat = now + self.keepalive_interval
                if self.teardown.started and self.teardown.escalate(self.launchers, now):
                    break
            self._close_stacks()
        finally:
            selector.close()
            self.teardown.close()
            io.flush_partials(self.launchers, self._line)
            self.console.flush()
        code, root = job_result(self.launchers, self.hang_host, self.stop_signal, time.time())
        return Outcome(exit_code=code, root=root, stop_reason=self.stop_reason, launchers=self.launchers,
                       seconds=time.monotonic() - start, stop_began=self.stop_began)

    # -- lines and host state --------------------------------------------------------------

    def _line(self, launcher: RemoteLauncher, stream: str, line: bytes) -> None:
        launcher.log.write(line)
        if stream == "out" and line.startswith(STACKS_MARKER):
            self._stacks_answer(launcher, line)
            return
        if stream == "out" and line.startswith(PROGRESS_MARKER):
            self._progress(launcher, line)
            return
        if stream == "err" and io.in_stacks_block(launcher, line):
            return
        if stream == "out" and line.startswith(RESULT_MARKER):
            io.read_result(launcher, line)
            self._note_hang(launcher)
            return
        self.console.relay(launcher, stream, line)

    def _ended(self, launcher: RemoteLauncher) -> bool:
        if not io.poll_end(launcher):
            return False
        self._note_hang(launcher)
        return True

    def _note_hang(self, launcher: RemoteLauncher) -> None:
        if launcher.exit_code == exitcodes.HANG and self.hang_host is None:
            self.hang_host = launcher

    def _decide(self) -> None:
        if self.stop_reason is not None:
            ending = self.in_place is not None and self.stop_signal is None
            self.teardown.begin(self.launchers, self.stop_signal, self.in_place if ending else None)
            return
        if self.hang_host is not None and not self._hang_reported:
            return  # the other hosts are being asked where their ranks are; _stacks_step stops the job
        failed = unhandled_failure(self.launchers)
        if failed is not None:
            self.request_stop(failure_reason(failed))
            self._decide()

    # -- the slow host ---------------------------------------------------------------------

    def _progress(self, launcher: RemoteLauncher, line: bytes) -> None:
        """A host's changed records: every rank compared with every other host's."""
        try:
            items = parse_progress(line).get("records")
            records = []
            for rank, mtime, text in items if isinstance(items, list) else ():
                record = parse_record(str(text).encode(), float(mtime), int(rank))
                if record is not None:
                    records.append(record)
                    self._records[record.rank] = record
                    self._rank_hosts[record.rank] = launcher.name
        except (ValueError, TypeError):
            return  # a progress line is advice: a bad one is dropped
        for found in self._stragglers.observe(records, self._rank_hosts):
            self.console.say(found.line())
            if self.log_dir is not None:
                if self._events is None:
                    self._events = EventLog(str(self.log_dir), None, socket.gethostname())
                self._events.emit("straggler", slow_host=found.host, ranks=list(found.ranks),
                                  ratio=round(found.ratio, 2), basis=found.basis)

    # -- stacks across hosts ---------------------------------------------------------------

    def _stacks_answer(self, launcher: RemoteLauncher, line: bytes) -> None:
        try:
            stacks = HostStacks.from_json(parse_stacks(line), host=launcher.name)
        except (ValueError, TypeError, AttributeError):
            self.console.say(f"unreadable stacks line from {launcher.name}")
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
            io.send(launcher, STACKS_REQUEST_BYTE)  # a dead transport: the round times out

    def _stacks_step(self, now: float) -> None:
        """Open a round when asked or when a host hung; close it when complete or overdue."""
        if self._round is None:
            if self.hang_host is not None and not self._hang_reported:
                self._open_round("hang", HANG_WAIT, trigger=self.hang_host.name)
            elif self._stacks_wanted and not self.teardown.started:
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
            try:
                path = Path(write_stacks_report(merged.text(title), self.log_dir)).resolve()
                lines.append(f"  summary and each host's full-dump path: {path}")
            except WriteError as exc:  # a full log disk must not end the relay
                lines.append(f"  summary not written: {exc.strerror}")
        self.console.write_err("\n".join(lines) + "\n")
        if round_.why == "hang":
            self._hang_reported = True
            host = self.hang_host.name if self.hang_host else round_.trigger
            self.request_stop(f"hang: no rank on {host} made progress for its hang_timeout; {merged.culprit()}"
                              + self._phases(merged.suspects()))

    def _phases(self, ranks: Sequence[int]) -> str:
        """Where the suspects' progress files left them: phase and last step."""
        known = [self._records[rank] for rank in ranks if rank in self._records]
        return "".join(f"; rank {r.rank} in phase {r.phase}, last step recorded {r.step}" for r in known[:4])


class Teardown:
    """One teardown of all hosts: ``begin`` once, then ``escalate`` on every loop turn."""

    def __init__(self, settings: ConnectSettings, grace_period: float, console: Console) -> None:
        self.settings = settings
        self.grace_period = grace_period
        self.console = console
        #: When the head closed the launchers' stdin or ended the attempt (monotonic); None until then.
        self.started_at: float | None = None
        #: Every stdin is closed (not only the attempt ended).
        self.stopping = False
        self._term_sent = False
        self._kill_sent = False
        self._killers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ssh-kill")

    @property
    def started(self) -> bool:
        return self.started_at is not None

    def begin(self, launchers: Sequence[RemoteLauncher], signum: int | None = None,
              end_attempt: int | None = None) -> None:
        """EOF on every launcher's open stdin, a waiting one's too: it stops its workers (if
        any) and reports. ``signum``: the stop signal the head got, written just before the
        EOF, so every host passes it on to its workers as it would had it got the signal itself.

        ``end_attempt``: only end that attempt, with the end word to every launcher still in
        it; they stay, waiting. A later call without it (a stop signal) still closes every stdin."""
        if self.started_at is None:
            self.started_at = time.monotonic()
        elif self.stopping or end_attempt is not None:
            return
        self.stopping = end_attempt is None
        for launcher in launchers:
            if launcher.over or launcher.stdin_closed:
                continue
            if not launcher.done:
                launcher.eof_sent = True
            if end_attempt is not None:
                if not launcher.done:
                    io.send(launcher, end_attempt_word(end_attempt))
                continue
            launcher.stdin_closed = True
            launcher.done = launcher.over
            if signum is not None:
                io.send(launcher, stop_request_byte(signum))
            try:
                launcher.channel.shutdown_write()
            except (OSError, EOFError, Exception):  # noqa: BLE001
                pass

    def escalate(self, launchers: Sequence[RemoteLauncher], now: float) -> bool:
        """Kill stragglers by process group; True when it is time to give up waiting."""
        assert self.started_at is not None
        waited = now - self.started_at
        running = [lau for lau in launchers if not lau.done]
        if not self._term_sent and waited > self.grace_period + KILL_MARGIN:
            self._term_sent = True
            for launcher in running:
                self._killers.submit(self.kill, launcher, "TERM")
        if not self._kill_sent and waited > self.grace_period + 2 * KILL_MARGIN:
            self._kill_sent = True
            for launcher in running:
                self._killers.submit(self.kill, launcher, "KILL")
        return waited > self.grace_period + 3 * KILL_MARGIN + self.settings.timeout

    def kill(self, launcher: RemoteLauncher, signal_name: str) -> None:
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
            self.console.say(f"sent SIG{signal_name} to the launcher's process group on {launcher.name}")
        except (ConnectError, OSError, EOFError, Exception) as exc:  # noqa: BLE001
            self.console.say(f"could not reach {launcher.name} to stop it ({exc}); it stops on its own when "
                             "the keepalive stops")
        finally:
            if client is not None:
                client.close()

    def close(self) -> None:
        """Kills not yet under way are dropped: the run is over."""
        self._killers.shutdown(wait=False, cancel_futures=True)
