"""``ssh.link_timeout``: how soon the head counts a host with a cut link as lost. No sshd: a
real TCP socket on the loopback for the option, plain values for the rest. Its validation
rows are in tests/hostile/test_jobfile.py; the measured figure in test_fault_tolerance.py."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Iterator

import pytest

from clusterddp.launch.ssh.attempt import keepalive_interval
from clusterddp.launch.ssh.hosts import Host
from clusterddp.launch.ssh.io import RemoteLauncher, lost_reason, poll_end
from clusterddp.launch.ssh.reach import ConnectSettings, HostSession, LaunchPlan, open_socket, user_timeout_ms
from clusterddp.spec import load_job
from tests.conftest import REPO


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on the loopback to connect to."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    yield server
    server.close()


def _host(port: int) -> Host:
    return Host("h", "127.0.0.1", port, "u", (), (), None, "test:1")


@pytest.mark.parametrize("settings,expected_ms", [
    (ConnectSettings(), 1000),
    (ConnectSettings(link_timeout=2.5), 2500),
    (ConnectSettings(link_timeout=0.5), 500),
])
def test_the_socket_carries_the_link_timeout(listener: socket.socket, settings: ConnectSettings,
                                              expected_ms: int) -> None:
    """The head's socket to a host has TCP_USER_TIMEOUT = the link timeout in ms (and keepalive on)."""
    sock = open_socket(_host(listener.getsockname()[1]), settings)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == expected_ms
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    finally:
        sock.close()


def test_the_job_key_reaches_the_settings(tmp_path: Path) -> None:
    """Default 1 s; a value in the job file is read as seconds."""
    path = tmp_path / "job.yaml"
    path.write_text(f"script: {REPO / 'jobs' / 'hello.py'}\n")
    assert load_job(path).ssh.link_timeout == 1.0 == ConnectSettings().link_timeout
    path.write_text(f"script: {REPO / 'jobs' / 'hello.py'}\nssh: {{link_timeout: 2.5}}\n")
    assert load_job(path).ssh.link_timeout == 2.5


@pytest.mark.parametrize("seconds,ms", [(1.0, 1000), (0.5, 500), (2.5, 2500), (5.0, 5000), (1.2345, 1234),
                                        (0.0001, 1)])
def test_user_timeout_is_whole_milliseconds(seconds: float, ms: int) -> None:
    """The kernel takes an int of milliseconds, never 0 (0 would mean the system's default)."""
    assert user_timeout_ms(seconds) == ms


@pytest.mark.parametrize("explicit,link_timeout,expected", [
    (None, 1.0, 0.25),    # the default: a dead host named within 1.25 s
    (None, 0.5, 0.125),
    (None, 2.5, 0.625),
    (None, 4.0, 1.0),     # never slower than once a second
    (None, 5.0, 1.0),
    (2.0, 1.0, 2.0),      # given explicitly: as given
    (0.3, 5.0, 0.3),
])
def test_keepalive_interval_follows_the_link_timeout(explicit: float | None, link_timeout: float,
                                                     expected: float) -> None:
    """min(1 s, link_timeout / 4) unless set: detection is at most link_timeout + interval."""
    assert keepalive_interval(explicit, link_timeout) == expected


@pytest.mark.parametrize("seconds,text", [(1.0, "1s"), (0.5, "0.5s"), (2.5, "2.5s"), (5.0, "5s"), (1.25, "1.25s")])
def test_lost_reason_names_the_link_timeout(seconds: float, text: str) -> None:
    """The report says how long the link went unacknowledged, as it was set."""
    assert lost_reason(seconds) == f"connection lost (no TCP acknowledgement for {text}: link down or host dead?)"


class _DeadChannel:
    """A channel whose transport is gone and that never sent an exit status (a cut link)."""

    def get_transport(self) -> None:
        return None

    def exit_status_ready(self) -> bool:
        return False

    def recv_ready(self) -> bool:
        return False

    def recv_stderr_ready(self) -> bool:
        return False

    def recv_exit_status(self) -> int:
        return -1


def test_a_lost_host_is_timed_from_its_own_link_timeout() -> None:
    """A host lost over a 2.5 s link timeout is reported so, failed 2.5 s before the head noticed."""
    session = HostSession(host=_host(22), node_rank=0, link_timeout=2.5, channel=_DeadChannel())  # type: ignore[arg-type]
    launcher = RemoteLauncher(session, LaunchPlan(host="h", node_rank=0, nproc=1, argv=()), log=None)  # type: ignore[arg-type]
    before = time.time()
    assert poll_end(launcher)
    after = time.time()
    assert launcher.lost == lost_reason(2.5) and launcher.over
    # noticed during poll_end, dated one link timeout earlier (bounds from the test's own clock)
    assert launcher.failed_at is not None and before - 2.5 <= launcher.failed_at <= after - 2.5
