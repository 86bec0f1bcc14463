"""``clusterddp report`` (and the run ids ``stacks`` and ``logs`` echo) on hostile input: an event
log someone else wrote, of any kind of file, and run ids of any length (issue 32, item 5).

Every case is the real CLI in a subprocess: one bounded line or a report with notes, never a
traceback, a hang or a terminal control sequence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import cli

#: Longest line any of these outputs may have (the error-line bound, with room for the prefix).
LONGEST = 1100
LONG_ID = "r" * 5000


def _good(t: float, kind: str, **fields: object) -> str:
    return json.dumps({"t": t, "kind": kind, "node": None, "host": "h", "attempt": 0, **fields})


def _report(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    done = cli("report", *args, "--log-dir", str(tmp_path / "logs"), timeout=60)
    return done.returncode, done.stdout, done.stderr


def _assert_clean(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text[-2000:]
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, repr(text[:2000])
        assert max((len(line) for line in text.splitlines()), default=0) <= LONGEST, \
            max(text.splitlines(), key=len)[:200]


HOSTILE_LINES = {
    "t -1e308": '{"t":-1e308,"kind":"run_start"}',
    "t 1e308": '{"t":1e308,"kind":"run_end"}',
    "t 1e400": '{"t":1e400,"kind":"run_end"}',
    "t NaN": '{"t":NaN,"kind":"hang"}',
    "t Infinity": '{"t":Infinity,"kind":"hang"}',
    "deep JSON": '{"t":105,"kind":"x","v":' + "[" * 30000 + "]" * 30000 + "}",
    "deep but short": '{"t":105,"kind":"x","v":' + "[" * 40 + "]" * 40 + "}",
    "attempt a list": '{"t":105,"kind":"attempt_start","attempt":[1]}',
    "node a dict": '{"t":105,"kind":"phase","name":"eval","edge":"start","node":{"a":1}}',
    "host a list": '{"t":105,"kind":"x","host":[1,2]}',
    "at 1e308": '{"t":105,"kind":"first_step","at":1e308}',
    "timeout -inf": '{"t":105,"kind":"hang","timeout_s":-Infinity}',
}


def test_hostile_lines_are_skipped_with_a_note_and_the_rest_reported(tmp_path: Path) -> None:
    """Huge or non-finite times, deep nesting, wrong field types: each line skipped with a note
    (or its field ignored), the good events reported, exit 0, no traceback."""
    run = tmp_path / "logs" / "r"
    run.mkdir(parents=True)
    lines = [_good(100.0, "run_start"), _good(100.0, "attempt_start"), *HOSTILE_LINES.values(),
             _good(110.0, "attempt_end", exit_code=0), _good(111.0, "run_end", exit_code=0)]
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = _report(tmp_path, "r")
    _assert_clean(out, err)
    assert code == 0, err
    assert "goodput:" in out and "wall clock 11.00s" in out, out
    assert "its time t is not a time" in out and "not an event" in out, out
    assert "nested deeper than 32 levels" in out, out
    done = cli("report", "r", "--json", "--log-dir", str(tmp_path / "logs"), timeout=60)
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


def test_terminal_control_sequences_from_an_event_log_are_shown_escaped(tmp_path: Path) -> None:
    """ESC[2J (clear the screen), an OSC title ended by BEL, a C1 CSI: printed as escapes."""
    run = tmp_path / "logs" / "r"
    run.mkdir(parents=True)
    evil = "\x1b[2J\x1b]0;pwned\x07\x9b31m"
    lines = [_good(1.0, "run_start", job=evil), _good(2.0, "x" + evil, why=evil),
             json.dumps({"t": 3.0, "kind": "run_end", "host": evil, evil: 1})]
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = _report(tmp_path, "r")
    _assert_clean(out, err)
    assert code == 0, err
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in out, out


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "too-big"])
def test_an_event_log_that_is_not_a_small_regular_file_is_skipped(tmp_path: Path, kind: str) -> None:
    """A FIFO (would hang), a link to /dev/zero (would read until MemoryError), a directory, a
    file over the cap: skipped with a note; the node's other file is still reported."""
    run = tmp_path / "logs" / "r"
    run.mkdir(parents=True)
    bad = run / "events.jsonl"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "dev-zero":
        bad.symlink_to("/dev/zero")
    elif kind == "directory":
        bad.mkdir()
    else:
        with open(bad, "wb") as f:
            f.truncate((64 << 20) + 1)  # sparse: no disk used
    (run / "events.node0.jsonl").write_text(_good(1.0, "run_start") + "\n" + _good(2.0, "run_end") + "\n")
    code, out, err = _report(tmp_path, "r")
    _assert_clean(out, err)
    assert code == 0, err
    assert "note: events.jsonl:" in out and "skipped" in out, out


def test_an_event_log_that_is_only_a_fifo_is_one_line(tmp_path: Path) -> None:
    """No other file: one error line, exit 2 (the newest-run search finds it too)."""
    run = tmp_path / "logs" / "r"
    run.mkdir(parents=True)
    os.mkfifo(run / "events.jsonl")
    code, out, err = _report(tmp_path)
    _assert_clean(out, err)
    assert code == 2 and out == "", (out, err)
    assert len(err.splitlines()) == 1 and "not a regular file" in err, err


def test_a_log_of_garbage_gives_a_bounded_list_of_notes(tmp_path: Path) -> None:
    """100,000 bad lines: the first 20 named, then their count; not 100,000 notes."""
    run = tmp_path / "logs" / "r"
    run.mkdir(parents=True)
    (run / "events.jsonl").write_text(_good(1.0, "run_start") + "\n" + "garbage\n" * 100_000)
    code, out, err = _report(tmp_path, "r")
    _assert_clean(out, err)
    assert code == 0, err
    assert len(out.splitlines()) < 40 and "more lines skipped" in out, out[-500:]


@pytest.mark.parametrize("argv", [
    ("report", LONG_ID),
    ("report", "\x1b[2J" + LONG_ID),
    ("stacks", LONG_ID),
    ("logs", LONG_ID),
    ("logs", "k8s", "hello", "--namespace", LONG_ID),
])
def test_a_5000_character_run_id_is_echoed_cut(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """A run id (or a value of a flag) of 5,000 characters: one line of bounded length, exit 2."""
    done = cli(*argv, cwd=tmp_path, timeout=60)
    _assert_clean(done.stdout, done.stderr)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) <= 2, done.stderr  # the line and its hint
    assert " characters)" in done.stderr or "control character '\\x1b'" in done.stderr, done.stderr
