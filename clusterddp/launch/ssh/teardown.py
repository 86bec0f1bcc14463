"""Stopping every host, each layer covering the failure of the one before (relay.py's
docstring lists all four): close each launcher's stdin, then ``kill -TERM`` its process
group over SSH ``grace + 2`` s later, then ``-KILL`` 2 s after that, then give up waiting.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from clusterddp.launch.ssh.io import Console, RemoteLauncher
from clusterddp.launch.ssh.reach import ConnectError, ConnectSettings, kill_command, open_client

KILL_MARGIN = 2.0


class Teardown:
    """One teardown of all hosts: ``begin`` once, then ``escalate`` on every loop turn."""

    def __init__(self, settings: ConnectSettings, grace_period: float, console: Console) -> None:
        self.settings = settings
        self.grace_period = grace_period
        self.console = console
        #: When the head closed the launchers' stdin (monotonic); None until then.
        self.started_at: float | None = None
        self._term_sent = False
        self._kill_sent = False
        self._killers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ssh-kill")

    @property
    def started(self) -> bool:
        return self.started_at is not None

    def begin(self, launchers: Sequence[RemoteLauncher]) -> None:
        """EOF on every running launcher's stdin: it stops its workers and reports."""
        if self.started_at is not None:
            return
        self.started_at = time.monotonic()
        for launcher in launchers:
            if not launcher.done:
                launcher.eof_sent = True
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
                             "the heartbeat stops")
        finally:
            if client is not None:
                client.close()

    def close(self) -> None:
        """Kills not yet under way are dropped: the run is over."""
        self._killers.shutdown(wait=False, cancel_futures=True)
