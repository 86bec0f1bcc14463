"""The rules of a fan-out's attempts (clusterddp.launch.ssh.attempt) and of choosing their hosts
(clusterddp.launch.ssh.hosts), with plain values."""

from __future__ import annotations

import pytest

from clusterddp.launch.ssh.attempt import Attempt, next_backoff, restart_line, start_line
from clusterddp.launch.ssh.hosts import choose_hosts, too_few


def attempt(number: int, code: int, failure: str | None = "h4: connection lost") -> Attempt:
    return Attempt(number=number, hosts=("h1", "h2", "h3", "h4"), world_size=4, exit_code=code,
                   failure=failure, seconds=12.34)


def test_first_max_healthy_hosts_in_order_the_rest_named() -> None:
    candidates = [("h1", 1, []), ("h2", 2, ["connection refused"]), ("h3", 3, []), ("h4", 4, []), ("h5", 5, [])]
    selection = choose_hosts(candidates, high=3)
    assert selection.chosen == [1, 3, 4]
    assert selection.left_out == [("h2", "connection refused"), ("h5", "spare (nodes: at most 3)")]


def test_too_few_names_the_need() -> None:
    assert too_few(3, 3, 4) is None and too_few(4, 4, 4) is None
    assert too_few(2, 3, 4) == "2 host(s) ready, the job needs at least 3 (nodes: 3:4)"
    assert too_few(3, 4, 4) == "3 host(s) ready, the job needs 4"


@pytest.mark.parametrize("code, number, restarts, stopping, expected", [
    (0, 0, 2, False, None),        # success
    (255, 0, 2, False, 0.0),       # a lost host: restart at once
    (1, 1, 2, False, 1.0),         # second restart: 1 s
    (1, 2, 2, False, None),        # used up
    (1, 0, 0, False, None),        # no restarts asked
    (75, 0, 2, False, None),       # preempted: the scheduler's business
    (65, 0, 2, False, None),       # non-finite loss: the same state gives the same NaN
    (124, 0, 2, False, 0.0),       # a hang is restarted
    (143, 0, 2, True, None),       # the head was told to stop
    (1, 40, 100, False, 30.0),     # the backoff is bounded
])
def test_next_backoff(code: int, number: int, restarts: int, stopping: bool, expected: float | None) -> None:
    assert next_backoff([attempt(number, code)], restarts, stopping) == expected


def test_lines() -> None:
    last = attempt(0, 255)
    assert restart_line(last, 2, 1.0, {"h4": "connection lost in attempt 1"}) == (
        "attempt 1 failed (h4: connection lost); restarting the whole job in 1s (restart 1 of 2); "
        "left out: h4 (connection lost in attempt 1)")
    assert start_line(1, ["h1", "h2", "h3"], 3, [("h4", "connection lost in attempt 1")]) == (
        "restart 1: 3 host(s) h1,h2,h3 (world size 3); not used: h4: connection lost in attempt 1")
    assert last.line() == ("attempt 1: 4 host(s) (world size 4) h1,h2,h3,h4: exit 255 after 12.3s; "
                           "first failure h4: connection lost")
    assert attempt(1, 0, None).line().endswith(": finished after 12.3s")
