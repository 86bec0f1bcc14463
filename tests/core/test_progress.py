"""The progress file: written by train.liveness, read by clusterddp.progress; the event log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from clusterddp import events, progress
from clusterddp.protocol import HEARTBEAT_FILE_ENV
from clusterddp.train import liveness


@pytest.fixture
def beat_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "rank0.heartbeat"
    monkeypatch.setenv(HEARTBEAT_FILE_ENV, str(path))
    liveness.reset()
    yield path
    liveness.reset()


def test_first_step_is_written_at_once(beat_file: Path) -> None:
    """The first heartbeat writes a record with its step; calls within a second write nothing."""
    assert liveness.heartbeat(compute_s=0.25)
    assert not liveness.heartbeat(compute_s=0.5)
    record = progress.read_progress(str(beat_file), rank=3)
    assert record is not None
    assert (record.rank, record.step, record.steps, record.compute_s, record.phase) == (3, 1, 1, 0.25, "train")
    assert record.step_s is None and record.t is not None and abs(record.t - time.time()) < 600  # wall-clock time, not monotonic


def test_record_means_over_the_steps_since_the_last(beat_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """steps, step_s and compute_s cover the steps since the previous record; step is the caller's."""
    liveness.heartbeat(step=10)
    monkeypatch.setattr(liveness, "MIN_INTERVAL", 0.0)
    time.sleep(0.05)
    liveness.MIN_INTERVAL = 10.0
    liveness.heartbeat(step=11, compute_s=0.01)
    time.sleep(0.05)
    liveness.MIN_INTERVAL = 0.0
    liveness.heartbeat(step=12, compute_s=0.03)
    record = progress.read_progress(str(beat_file))
    assert record is not None
    assert (record.step, record.steps) == (12, 2)
    assert record.step_s is not None and record.step_s > 0.04  # two sleeps of 0.05 s, however loaded the machine
    assert record.compute_s == pytest.approx(0.02)


def test_phase_is_written_at_once_and_ends(beat_file: Path) -> None:
    """Entering and leaving a phase rewrite the record even within the one-second bound."""
    liveness.heartbeat()
    with liveness.phase("checkpoint"):
        record = progress.read_progress(str(beat_file))
        assert record is not None and record.phase == "checkpoint" and record.step == 1
        with liveness.phase("checkpoint"):  # nested: still the same phase
            pass
        record = progress.read_progress(str(beat_file))
        assert record is not None and record.phase == "checkpoint"
    record = progress.read_progress(str(beat_file))
    assert record is not None and record.phase == "train"


def test_step_context_reports_marked_compute(beat_file: Path) -> None:
    """``with step() as s`` is one heartbeat whose compute is what ``s.compute()`` wrapped."""
    with liveness.step(5) as s:
        began = time.monotonic()
        with s.compute():
            time.sleep(0.02)
        wrapped = time.monotonic() - began
        time.sleep(0.2)
    record = progress.read_progress(str(beat_file))
    assert record is not None and record.step == 5
    # what compute() wrapped, not the 0.2 s after it (bounds from the test's own clock: no speed claim)
    assert record.compute_s is not None and 0.015 < record.compute_s <= wrapped + 0.001


def test_shorter_record_is_padded_not_torn(beat_file: Path) -> None:
    """A shorter record overwrites a longer one in place, padded with spaces: still one object."""
    with liveness.phase("x" * 60):
        pass
    size = beat_file.stat().st_size
    with liveness.phase("y"):
        assert beat_file.stat().st_size == size
        assert json.loads(beat_file.read_bytes())["phase"] == "y"


def test_no_file_named_is_harmless(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the variable, or with a vanished directory, heartbeat writes nothing and raises nothing."""
    monkeypatch.delenv(HEARTBEAT_FILE_ENV, raising=False)
    liveness.reset()
    assert not liveness.heartbeat()
    monkeypatch.setenv(HEARTBEAT_FILE_ENV, str(tmp_path / "gone" / "hb"))
    liveness.reset()
    assert not liveness.heartbeat()
    with liveness.phase("eval"):
        pass
    liveness.reset()


@pytest.mark.parametrize("content", [
    b"", b"{", b'{"v":1,"step":', b"\x00\x00\x00", b"garbage", b"[1,2]", b'{"v":99,"step":1}',
    b'{"v":1,"step":"x","t":"y","steps":-3,"phase":7}' + b"junk", b"\xff\xfe",
])
def test_read_progress_tolerates_anything(tmp_path: Path, content: bytes) -> None:
    """Empty, partial, garbage or future records read as None or as a record with unknowns, never raise."""
    path = tmp_path / "hb"
    path.write_bytes(content)
    record = progress.read_progress(str(path))
    assert record is None or (record.step is None and record.phase == "train" and record.steps == 0)


def test_read_progress_missing_file(tmp_path: Path) -> None:
    """No file: no record."""
    assert progress.read_progress(str(tmp_path / "none")) is None


def test_judgements() -> None:
    """The pure functions over a group of records."""
    def rec(rank: int, step: int | None, t: float | None, compute: float | None, phase: str = "train") -> progress.RankProgress:
        return progress.RankProgress(rank, step, t, 1, 0.1, compute, phase, 0.0, 0.0)

    group = [rec(0, 5, 100.0, 0.1), rec(1, 7, 101.0, 0.3, "checkpoint"), rec(2, None, None, None)]
    assert progress.stepped_since(group, 100.5) and not progress.stepped_since(group, 102.0)
    assert progress.first_step_t(group, 0.0) == 100.0
    assert progress.max_step(group) == 7
    assert [r.rank for r in progress.in_phase(group)] == [1]
    assert progress.median_compute(group) == pytest.approx(0.2)
    assert progress.median([]) is None


def test_events_merged_by_time(tmp_path: Path) -> None:
    """Two writers' files (owner and node 1) read back as one list in time order."""
    owner = events.EventLog(str(tmp_path), None, "head")
    node = events.EventLog(str(tmp_path), 1, "n1")
    owner.emit("run_start", job="j")
    time.sleep(0.01)
    node.emit("attempt_start")
    time.sleep(0.01)
    owner.attempt = 1
    owner.emit("run_end", exit_code=0)
    owner.close()
    node.close()
    read, problems = events.read_events(str(tmp_path))
    assert problems == []
    assert [(e["kind"], e["node"], e["attempt"]) for e in read] == [
        ("run_start", None, 0), ("attempt_start", 1, 0), ("run_end", None, 1)]
    assert {e["file"] for e in read} == {"events.jsonl", "events.node1.jsonl"}


def test_long_event_is_cut_to_one_line() -> None:
    """An event with a huge field stays one line under MAX_LINE, marked cut."""
    line = events.encode({"t": 1.0, "kind": "attempt_end", "why": "x" * 10000, "tail": ["y" * 100] * 100})
    assert len(line) <= events.MAX_LINE and line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["cut"] is True


def test_torn_last_line_is_reported(tmp_path: Path) -> None:
    """A last line without its newline (a writer killed mid-write) is skipped and named; garbage too."""
    (tmp_path / "events.jsonl").write_bytes(b'{"t":1,"kind":"run_start"}\nnot json\n{"t":2,"kind":"att')
    read, problems = events.read_events(str(tmp_path))
    assert [e["kind"] for e in read] == ["run_start"]
    assert len(problems) == 2 and "torn" in problems[1] and "events.jsonl:2" in problems[0]


WRITER = """
import sys
from clusterddp.events import EventLog
log = EventLog(sys.argv[1], None, "h")
print("ready", flush=True)
n = 0
while True:
    n += 1
    log.emit("phase", name="p" * (n % 1500), n=n)
"""


def test_kill_9_mid_write_leaves_whole_lines(tmp_path: Path) -> None:
    """A writer SIGKILLed while appending as fast as it can leaves one JSON object per line."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    read, problems = events.read_events(str(tmp_path))
    assert len(read) > 100
    assert all(e["n"] == i + 1 for i, e in enumerate(read))
    assert len(problems) <= 1 and all("torn" in p for p in problems)
