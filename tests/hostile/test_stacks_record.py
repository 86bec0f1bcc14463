"""``clusterddp stacks`` signals the run's launcher and nothing else: a stale, forged or corrupt
``launcher.json`` gets one line and exit 2, never a signal to a stranger, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp import procid
from clusterddp.protocol import STACKS_REQUEST_SIGNAL
from tests.conftest import cli_env

#: A process that is not the job's: the stacks signal's default action (terminate) would end it.
STRANGER = "import time; print('up', flush=True); time.sleep(600)"


@pytest.fixture
def stranger():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-c", STRANGER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    yield proc
    proc.kill()
    proc.wait()


def _stacks(log_dir: Path, *target: str) -> subprocess.CompletedProcess[str]:
    """``clusterddp stacks`` in a session of its own: a pid of 0 must not reach pytest's group."""
    return subprocess.run([sys.executable, "-m", "clusterddp", "stacks", *target, "--log-dir", str(log_dir),
                           "--timeout", "1"], env=cli_env(), capture_output=True, text=True, timeout=600,
                          start_new_session=True)


def _record(log_dir: Path, run: str, content: str | bytes) -> Path:
    (log_dir / run).mkdir(parents=True, exist_ok=True)
    path = log_dir / run / "launcher.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("clusterddp: error: "), result.stderr
    assert len(lines) <= 2 and all(len(line) < 400 for line in lines), result.stderr
    return result.stderr


def _as_launcher_wrote(pid: int, **change: object) -> str:
    record = {**procid.ProcessIdentity(pid, procid.start_time(pid), procid.boot_id(),
                                       __import__("socket").gethostname()).as_record(),
              "host": "h", "hostname": __import__("socket").gethostname(), "run_id": "old", "ranks": [0]}
    record.update(change)
    return json.dumps(record)


@pytest.mark.parametrize("change, why", [
    ({"start_time": "shift"}, "now another process"),        # the launcher gone, its pid reused
    ({"start_time": None}, "no start time"),                 # a record of an older clusterddp
    ({"boot_id": "0" * 36}, "before this machine last booted"),
    ({"hostname": "elsewhere"}, "on host elsewhere"),        # another host's record on a shared FS
])
def test_a_stale_record_never_signals_the_process_now_at_its_pid(tmp_path: Path, stranger, change: dict[str, object],
                                                                  why: str) -> None:  # type: ignore[no-untyped-def]
    if change.get("start_time") == "shift":
        change = {"start_time": procid.start_time(stranger.pid) - 1}
    _record(tmp_path, "old", _as_launcher_wrote(stranger.pid, **change))
    err = _one_line(_stacks(tmp_path, "old"))
    assert why in err and "nothing was signalled" in err
    assert stranger.poll() is None  # alive: it got no signal


def test_the_record_of_a_live_process_is_signalled(tmp_path: Path) -> None:
    """The proof passes for the process itself: the signal is sent (and, unanswered, timed out)."""
    proc = subprocess.Popen([sys.executable, "-c", f"import signal, sys, time\n"
                             f"signal.signal({int(STACKS_REQUEST_SIGNAL)}, lambda *a: (print('asked', flush=True)))\n"
                             f"print('up', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        _record(tmp_path, "old", _as_launcher_wrote(proc.pid))
        err = _one_line(_stacks(tmp_path, "old"))
        assert "no stacks from run old within 1s" in err
        assert proc.stdout.readline() == "asked\n"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("pid", ["0", "0.5", "false", "true", "1.5", "-1", "null", "NaN", "Infinity", '"123"',
                                 str(2**31), str(2**70), "1e3", "[1]", '{"a": 1}'])
def test_only_a_positive_integer_pid_is_taken(tmp_path: Path, pid: str) -> None:
    """0 would signal stacks' own group, true/1.5 pid 1, -1 every process the user may signal."""
    _record(tmp_path, "bad", '{"pid": %s, "run_id": "bad", "start_time": 1, "boot_id": "x"}' % pid)
    err = _one_line(_stacks(tmp_path, "bad"))
    assert "has no valid pid" in err


@pytest.mark.parametrize("value", [0, -1, True, False, 1.5, 0.5, None, "7", 2**22 + 1, 2**70])
def test_valid_pid_refuses_what_kill_reads_as_a_group(value: object) -> None:
    assert procid.valid_pid(value) is None


CORRUPT: dict[str, str | bytes] = {
    "garbage": "this is not json {",
    "empty": "",
    "no-pid": '{"run_id": "x"}',
    "array": "[1, 2]",
    "binary": b"\x00\xff\xfe\x80" * 100,
    "deep": "[" * 30_000 + "]" * 30_000,
    "huge": '{"pid": 1, "pad": "' + "x" * 200_000 + '"}',
    "digits": '{"pid": ' + "9" * 5000 + "}",
}


@pytest.mark.parametrize("kind", sorted(CORRUPT) + ["fifo", "dev-zero", "directory"])
def test_a_corrupt_record_is_one_line(tmp_path: Path, kind: str) -> None:
    run = tmp_path / kind
    run.mkdir()
    if kind == "fifo":
        os.mkfifo(run / "launcher.json")  # a reader that blocks on it hangs `stacks`
    elif kind == "dev-zero":
        os.symlink("/dev/zero", run / "launcher.json")
    elif kind == "directory":
        (run / "launcher.json").mkdir()
    else:
        _record(tmp_path, kind, CORRUPT[kind])
    err = _one_line(_stacks(tmp_path, kind))
    assert "launcher.json" in err


def test_a_long_hostile_run_id_is_cut_and_escaped(tmp_path: Path, stranger) -> None:  # type: ignore[no-untyped-def]
    _record(tmp_path, "long", _as_launcher_wrote(stranger.pid, run_id="\x1b[2J" + "r" * 5000, start_time=1))
    err = _one_line(_stacks(tmp_path, "long"))
    assert "\x1b" not in err and "5004 characters" in err
    assert stranger.poll() is None


def test_the_search_skips_corrupt_records_and_signals_no_stranger(tmp_path: Path, stranger) -> None:  # type: ignore[no-untyped-def]
    """Without a run id: every broken file is skipped with one line, none stops the search."""
    for kind, content in CORRUPT.items():
        _record(tmp_path, kind, content)
    os.mkdir(tmp_path / "fifo")
    os.mkfifo(tmp_path / "fifo" / "launcher.json")
    _record(tmp_path, "stale", _as_launcher_wrote(stranger.pid, start_time=1))
    result = _stacks(tmp_path)
    err = _one_line_after_skips(result)
    assert f"no running clusterddp job found under {tmp_path}/" in err
    assert stranger.poll() is None


def _one_line_after_skips(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    skipped = [line for line in lines if line.startswith("clusterddp: skipped ")]
    assert len(skipped) == len(CORRUPT) + 1, result.stderr  # each corrupt file and the FIFO, once
    assert all(len(line) < 400 for line in lines)
    return result.stderr
