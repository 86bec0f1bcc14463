"""The fan-out's outcome rules (launch/ssh/outcome.py) on plain data: no sshd, no channel, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from clusterddp import exitcodes
from clusterddp.launch.ssh.outcome import (HOST_LOST, HostState, Outcome, attempt_failure, failure_reason,
                                           format_outcome, host_exit_code, job_result, progressed, root_cause,
                                           unhandled_failure, verdict_failure)

NOW = 1000.0
LOST = "connection lost (no TCP acknowledgement for 1s: link down or host dead?)"


def failed(code: int, at: float | None = None, **cause: Any) -> dict[str, Any]:
    """A launcher's result line whose worker failed with ``code`` (``at``: when, on the host's clock)."""
    return {"exit_code": code, "root_cause": {"exit_code": code, "at": at, **cause}}


def hosts(*specs: dict[str, Any]) -> list[HostState]:
    """Hosts n0, n1, ... from keyword dicts; a host is done unless it says otherwise."""
    return [HostState(name=f"n{i}", **{"done": True, **spec}) for i, spec in enumerate(specs)]


@pytest.mark.parametrize("result,exit_status,lost,expected", [
    (None, None, None, None),                              # still running
    (None, 0, None, 0),                                    # ssh exit status only
    (None, 7, None, 7),
    (None, -1, None, HOST_LOST),                           # sshd sent no status
    ({"exit_code": 3}, 0, None, 3),                        # the result line beats the status
    ({"root_cause": None}, 0, None, 1),                    # a result line without a code fails
    ({"exit_code": 0}, 0, LOST, HOST_LOST),                # a lost link beats everything
])
def test_host_exit_code(result: dict[str, Any] | None, exit_status: int | None, lost: str | None,
                        expected: int | None) -> None:
    """One host's exit code: lost, else its result line, else its SSH status, else None."""
    assert host_exit_code(result, exit_status, lost) == expected
    state = HostState(name="n0", result=result, exit_status=exit_status, lost=lost)
    assert state.exit_code == expected and state.failed() == (expected not in (None, 0))


@pytest.mark.parametrize("specs,expected", [
    ([{"exit_status": 0}, {"exit_status": 0}], None),
    # the earliest failure wins, by its own clock, wherever it stands in host order
    ([{"result": failed(3, at=20.0)}, {"result": failed(5, at=10.0)}], "n1"),
    # a worker the head's stop killed is a consequence, not a cause
    ([{"result": failed(143, at=5.0, stopped_by_us=True), "eof_sent": True},
      {"result": failed(3, at=20.0)}], "n1"),
    # a host told to stop that exits non-zero without a cause is a consequence too
    ([{"exit_status": 1, "eof_sent": True, "failed_at": 1.0}, {"exit_status": 2, "failed_at": 9.0}], "n1"),
    # ... unless its link was lost: then it counts from when the link stopped acknowledging
    ([{"lost": LOST, "eof_sent": True, "failed_at": 4.0}, {"exit_status": 2, "failed_at": 9.0}], "n0"),
    # no time in the cause: the head's own time of the failure
    ([{"result": failed(3), "failed_at": 30.0}, {"exit_status": 2, "failed_at": 25.0}], "n1"),
    # a failure the head never timed counts as now
    ([{"exit_status": 2}, {"exit_status": 4, "failed_at": NOW - 1}], "n1"),
    ([{"exit_status": 2}, {"exit_status": 4}], "n0"),
    # only consequences: nobody to blame
    ([{"exit_status": 1, "eof_sent": True}, {"result": failed(143, stopped_by_us=True), "eof_sent": True}], None),
])
def test_root_cause(specs: list[dict[str, Any]], expected: str | None) -> None:
    """The host blamed is the one that failed first; hosts the head was stopping are not causes."""
    root = root_cause(hosts(*specs), NOW)
    assert (root.name if root else None) == expected


@pytest.mark.parametrize("specs,hang,stop_signal,expected", [
    ([{"exit_status": 0}, {"exit_status": 0}], None, None, (0, None)),
    ([{"exit_status": 0}, {"result": failed(3, at=1.0)}], None, None, (3, "n1")),
    # a hang beats an earlier failure: peers of the stopped ranks fail because of it
    ([{"result": failed(1, at=1.0)}, {"exit_status": exitcodes.HANG}], "n1", None, (exitcodes.HANG, "n1")),
    # the head was signalled and every host stopped as told
    ([{"exit_status": 143, "eof_sent": True}, {"exit_status": 0}], None, 15, (143, None)),
    # a root cause beats the signal
    ([{"result": failed(3, at=1.0)}, {"exit_status": 143, "eof_sent": True}], None, 2, (3, "n0")),
    # no cause and no signal, but a host failed or never reported back
    ([{"exit_status": 0}, {"exit_status": 137, "eof_sent": True}], None, None, (137, None)),
    ([{"exit_status": 0}, {"done": False}], None, None, (1, None)),
    ([{"lost": LOST}], None, None, (HOST_LOST, "n0")),
])
def test_job_result(specs: list[dict[str, Any]], hang: str | None, stop_signal: int | None,
                    expected: tuple[int, str | None]) -> None:
    """The job's exit code: a hang, else the root cause's, else 128 + the head's signal, else any failure."""
    states = hosts(*specs)
    hang_host = next((h for h in states if h.name == hang), None)
    code, root = job_result(states, hang_host, stop_signal, NOW)
    assert (code, root.name if root else None) == expected


@pytest.mark.parametrize("specs,expected", [
    ([{"exit_status": 0}, {"done": False}], None),
    ([{"exit_status": 0}, {"result": failed(3)}], "n1 failed (exit code 3)"),
    ([{"exit_status": 1, "eof_sent": True}, {"lost": LOST}], f"n1 failed ({LOST})"),
    ([{"exit_status": 1, "eof_sent": True}, {"done": False, "eof_sent": True}], None),
])
def test_unhandled_failure(specs: list[dict[str, Any]], expected: str | None) -> None:
    """The head stops the job for the first host that failed before it was told to stop, saying why."""
    host = unhandled_failure(hosts(*specs))
    assert (failure_reason(host) if host else None) == expected


def test_report_over_plain_data_names_the_first_failure_and_every_host() -> None:
    """The closing report and the attempt's failure line come from plain host states alone."""
    states = hosts({"result": failed(3, at=NOW, rank=4, local_rank=0, pid=77, log="/l/rank4.log", tail=["boom"])},
                   {"result": {"exit_code": 143}, "eof_sent": True}, {"result": {"exit_code": 0}})
    states[0].address, states[0].node_rank = "10.0.0.2", 2
    code, root = job_result(states, None, None, NOW)
    outcome = Outcome(exit_code=code, root=root, stop_reason="n0 failed (exit code 3)", launchers=states, seconds=1.0)
    lines = format_outcome("t", outcome).splitlines()
    assert lines[:3] == ["clusterddp: job 't' failed on n0: rank 4 exit code 3",
                         "  root cause (first failure across hosts):",
                         "    host:       n0 (10.0.0.2), node rank 2"]
    assert "      boom" in lines and lines[-3:] == [
        "    n0               node 2   failed: rank 4 exit code 3",
        "    n1               node 0   stopped by clusterddp (exit 143)",
        "    n2               node 0   finished (exit 0)"]
    assert attempt_failure(outcome) == "n0: rank 4 exit code 3"


TRACEBACK = ["Traceback (most recent call last):", '  File "/w/train.py", line 2, in <module>',
             "ImportError: cannot import name 'x' from 'os'"]


@pytest.mark.parametrize("code, root, expected", [
    (0, None, None),                                                                # success
    (exitcodes.HANG, {"result": failed(1)}, "hang"),                                # a hang, whatever the root
    (1, {"result": failed(1, tail=TRACEBACK)}, "ImportError at train.py:2"),        # the worker's traceback
    (137, {"result": failed(137, signal="SIGKILL")}, "SIGKILL"),
    (HOST_LOST, {"lost": LOST}, f"exit {HOST_LOST}"),                               # lost: never judged repeating
    (2, {"result": {"exit_code": 2, "root_cause": None, "reason": "bad job"}}, None),  # the launcher's own failure
    (143, None, None),                                                              # the head was stopped
])
def test_verdict_failure(code: int, root: dict[str, Any] | None, expected: str | None) -> None:
    """The head reads the root host's failure as a launcher alone reads its worker's."""
    host = hosts(root)[0] if root is not None else None
    failure = verdict_failure(Outcome(exit_code=code, root=host, stop_reason=None, launchers=[], seconds=1.0))
    assert (failure.name() if failure else None) == expected


@pytest.mark.parametrize("said, expected", [
    ([False, False], False),   # no rank of any host completed a step
    ([False, True], True),     # one host's ranks did
    ([None, False], False),    # a host that reported nothing is not a yes
    ([None], True),            # nobody said: unknown counts as progress (restart as before)
])
def test_progressed(said: list[bool | None], expected: bool) -> None:
    """Any host's ranks completing a step counts; no word from any host counts as progress."""
    states = hosts(*({"result": {"exit_code": 1, "progressed": p}} if p is not None else {"lost": LOST} for p in said))
    assert progressed(states) is expected
