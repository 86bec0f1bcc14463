"""A stop signal at any moment of the launcher's start ends it with 128 + signal and one line,
never killed by the signal (-15), and leaves nothing running (clusterddp.earlystop)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import cli_env, write_job


def _catches(pid: int, signum: int) -> bool:
    """The process has a handler for ``signum`` (SigCgt of /proc/<pid>/status): its Python runs."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (signum - 1) & 1)


def _family(proc: psutil.Process) -> dict[int, float]:
    try:
        return {p.pid: p.create_time() for p in proc.children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}


def _left_running(seen: dict[int, float]) -> list[int]:
    left = []
    for pid, created in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def _defaults() -> None:
    """The stop signals at their default in the launcher, as from a terminal: the suite itself
    may run under nohup or in a background shell, which leave SIGHUP or SIGINT ignored (and
    those the command leaves ignored, as python does)."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _start(job: Path) -> tuple[subprocess.Popen[str], psutil.Process]:
    proc = subprocess.Popen([sys.executable, "-m", "clusterddp", "run", str(job)], env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_defaults)
    return proc, psutil.Process(proc.pid)


def _stop(proc: subprocess.Popen[str], launcher: psutil.Process, signum: int, seen: dict[int, float]) -> str:
    proc.send_signal(signum)
    while proc.poll() is None:
        seen.update(_family(launcher))
        time.sleep(0.01)
    return proc.communicate(timeout=600)[1]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_when_the_first_child_starts_ends_with_128_plus_it(tmp_path: Path, signum: int) -> None:
    """The launcher's first child (the warm interpreter, before any supervisor exists): the
    signal is already handled then, and ends the command with 128 + it, its child gone too.
    Before: not handled until the supervisor's handlers, about a second in; killed by it."""
    job = write_job(tmp_path, script="silent.py", warm_start=True)
    proc, launcher = _start(job)
    seen: dict[int, float] = {}
    while not seen and proc.poll() is None:
        seen = _family(launcher)
    assert seen, proc.communicate()[1]
    assert _catches(proc.pid, signum)
    err = _stop(proc, launcher, signum, seen)
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and f"stopped by {signal.Signals(signum).name}" in err, err
    assert wait_gone(seen), _left_running(seen)


@pytest.mark.slow
def test_a_sigterm_at_any_moment_of_the_start_ends_with_143(tmp_path: Path) -> None:
    """Sampled over the start, from the moment the command handles SIGTERM (python's own start
    before that is as `python script.py`'s). The waits only pick moments: whatever moment a
    loaded machine makes of each, the outcome must be the same."""
    job = write_job(tmp_path, script="silent.py", warm_start=True)
    for delay in (0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4, 0.8, 1.2):
        proc, launcher = _start(job)
        while not _catches(proc.pid, signal.SIGTERM) and proc.poll() is None:
            time.sleep(0.001)
        seen = _family(launcher)
        end = time.monotonic() + delay
        while time.monotonic() < end:
            seen.update(_family(launcher))
        err = _stop(proc, launcher, signal.SIGTERM, seen)
        assert proc.returncode == 143, (delay, err)
        assert "Traceback" not in err, err
        assert wait_gone(seen), (delay, _left_running(seen))


def wait_gone(seen: dict[int, float]) -> bool:
    deadline = time.monotonic() + 600
    while _left_running(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _left_running(seen)


def test_a_signal_inherited_as_ignored_stays_ignored() -> None:
    """``nohup clusterddp ...``: SIGHUP was ignored before, and is not made to stop the command."""
    code = ("import signal, sys; from clusterddp import earlystop; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
            "earlystop.install(); print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, "
            "signal.getsignal(signal.SIGTERM) is earlystop._raise)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    assert out.stdout.split() == ["True", "True"]
