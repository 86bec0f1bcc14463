"""The restart verdict: failures that will repeat are not restarted, transient ones are (real processes)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from clusterddp.launch.verdict import Failure, failure_of, will_repeat
from clusterddp.spec import RestartOnSpec
from tests.conftest import cli, cli_env, start_cli, wait_for, write_job

STEP = "from clusterddp.train import heartbeat\nheartbeat()\n"
ATTEMPT = "import os\nattempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"

#: (case, script, job args, the words of the one line that says why)
DETERMINISTIC = [
    ("syntax", "x = (\n", [], "SyntaxError at train.py:1 before any progress"),
    ("indentation", "if True:\npass\n", [], "IndentationError at train.py:2 before any progress"),
    ("import", "import os\nfrom os import no_such_name_cddp\n", [], "ImportError at train.py:2 before any progress"),
    ("module", "import sys\nimport no_such_module_cddp\n", [], "ModuleNotFoundError at train.py:2 before any progress"),
    ("name", "import os\nprint(undefined_name_cddp)\n", [], "NameError at train.py:2 before any progress"),
    ("data", "open('/nonexistent-cddp/train.bin', 'rb')\n", [], "FileNotFoundError at train.py:1 before any progress"),
    ("argparse", "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', type=float)\np.parse_args()\n",
     ["--bogus", "1"], "exit 2 before any progress, a usage error"),
    ("assert", "for step in range(3):\n    assert step > 0, 'empty batch'\n", [], "AssertionError at train.py:2 before any progress"),
    ("same", "raise RuntimeError('no device')\n", [],
     "the same RuntimeError at train.py:1 before any progress, as in attempt 0"),
    ("resume", ATTEMPT + "if attempt == 0:\n    " + STEP.replace("\n", "\n    ") + "\nraise ValueError('bad checkpoint')\n", [],
     "the same ValueError at train.py:7 before any progress, as in attempt 0"),
]


def _run(tmp_path: Path, script: str, args: list[str] | None = None, restarts: int = 3, **fields: Any) -> tuple[Any, list[dict[str, Any]]]:
    (tmp_path / "train.py").write_text(script)
    job = write_job(tmp_path, script=str(tmp_path / "train.py"), args=args or [], nproc_per_node=1,
                    restarts=restarts, cpu_affinity="none", **fields)
    done = cli("run", str(job), "--run-id", "r", env=cli_env())
    return done, _events(tmp_path)


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "logs" / "r" / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _ends(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "attempt_end"]


@pytest.mark.parametrize("case, script, args, why", DETERMINISTIC, ids=[c[0] for c in DETERMINISTIC])
def test_deterministic_failure_is_not_restarted(tmp_path: Path, case: str, script: str, args: list[str], why: str) -> None:
    """A failure that will repeat stops at once (or after its one repeat), with one line and an event saying why."""
    done, events = _run(tmp_path, script, args)
    ends = _ends(events)
    expected = 2 if case in ("same", "resume") else 1
    assert done.returncode != 0
    assert len(ends) == expected, [e["why"] for e in ends]
    assert ends[-1]["verdict"] == "stop" and why in ends[-1]["why"]
    assert f"clusterddp: not restarting: {why}" in done.stderr
    assert done.stderr.count("not restarting") == 1


def test_restart_on_deterministic_true_restarts_anyway(tmp_path: Path) -> None:
    """restart_on.deterministic: true gives back the old rule: every failure is restarted."""
    done, events = _run(tmp_path, "import no_such_module_cddp\n", restarts=2, restart_on={"deterministic": True})
    assert [e["verdict"] for e in _ends(events)] == ["restart", "restart", "stop"]
    assert "not restarting" not in done.stderr


def test_restart_on_always_widens(tmp_path: Path) -> None:
    """restart_on.always: [FileNotFoundError] retries a missing file (a mount that comes late)."""
    script = ATTEMPT + "open('/nonexistent-cddp/x' if attempt == 0 else __file__)\n"
    done, events = _run(tmp_path, script, restarts=1, restart_on={"always": ["FileNotFoundError"]})
    assert done.returncode == 0, done.stderr
    assert [e["verdict"] for e in _ends(events)] == ["restart", "stop"]


def test_restart_on_never_narrows(tmp_path: Path) -> None:
    """restart_on.never: [KeyError] stops a KeyError even after progress."""
    done, events = _run(tmp_path, STEP + "{}['lr']\n", restart_on={"never": ["KeyError"]})
    assert [e["why"] for e in _ends(events)] == ["KeyError at train.py:3: restart_on.never lists KeyError"]


@pytest.mark.parametrize("case, script", [
    ("sigkill", ATTEMPT + "import signal\nif attempt == 0:\n    os.kill(os.getpid(), signal.SIGKILL)\n"),
    ("oom-kill", ATTEMPT + "import signal\nif attempt == 0:\n    os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer sends\n"),
    ("error-after-progress", ATTEMPT + STEP + "if attempt == 0:\n    raise RuntimeError('Connection reset by peer')\n"),
    ("collective-timeout-after-progress", ATTEMPT + STEP
     + "if attempt == 0:\n    raise RuntimeError('Timed out waiting 1800000ms for recv operation to complete')\n"),
], ids=lambda v: v if "\n" not in v else "")
def test_transient_failure_is_restarted(tmp_path: Path, case: str, script: str) -> None:
    """A worker killed by a signal, or one that fails after a step completed, is restarted and resumes."""
    done, events = _run(tmp_path, script, restarts=1)
    assert done.returncode == 0, done.stderr
    assert [e["verdict"] for e in _ends(events)] == ["restart", "stop"]
    assert "not restarting" not in done.stderr


def test_repeated_failure_after_progress_each_time_is_restarted(tmp_path: Path) -> None:
    """The same exception at the same place, but with steps completed in between, is not judged repeating."""
    done, events = _run(tmp_path, STEP + "raise RuntimeError('flaky')\n", restarts=2)
    assert [e["verdict"] for e in _ends(events)] == ["restart", "restart", "stop"]
    assert _ends(events)[-1]["why"] == "restarts used up (2)"


def test_sigterm_from_outside_is_restarted(tmp_path: Path) -> None:
    """A worker SIGTERMed by someone else (not its launcher) is restarted."""
    (tmp_path / "train.py").write_text(ATTEMPT + "import time\nprint('pid', os.getpid(), flush=True)\n"
                                       "open(os.path.join(os.path.dirname(__file__), f'pid{attempt}'), 'w').write(str(os.getpid()))\n"
                                       "time.sleep(60 if attempt == 0 else 0)\n")
    job = write_job(tmp_path, script=str(tmp_path / "train.py"), nproc_per_node=1, restarts=1, cpu_affinity="none")
    proc = start_cli("run", str(job), "--run-id", "r", env=cli_env())
    assert wait_for(lambda: (tmp_path / "pid0").exists() and (tmp_path / "pid0").read_text(), timeout=60)
    os.kill(int((tmp_path / "pid0").read_text()), signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    ends = _ends(_events(tmp_path))
    assert [e["verdict"] for e in ends] == ["restart", "stop"] and ends[0]["failure"] == "SIGTERM"


def test_hang_is_restarted(tmp_path: Path) -> None:
    """An attempt ended by the hang detector is restarted; the hang is an event."""
    script = ATTEMPT + "import time\nprint('up', flush=True)\ntime.sleep(60 if attempt == 0 else 0)\n"
    done, events = _run(tmp_path, script, restarts=1, hang_timeout=1)
    assert done.returncode == 0, done.stderr
    assert [e["verdict"] for e in _ends(events)] == ["restart", "stop"]
    assert [e["kind"] for e in events].count("hang") == 1


@pytest.mark.parametrize("tail, expected", [
    (["Traceback (most recent call last):", '  File "/x/train.py", line 3, in <module>', "    import foo",
      "ModuleNotFoundError: No module named 'foo'"], ("ModuleNotFoundError", "train.py:3")),
    (['  File "/a/b.py", line 9', "    x = (", "        ^", "SyntaxError: '(' was never closed"], ("SyntaxError", "b.py:9")),
    (["torch.distributed.DistBackendError: NCCL error"], ("DistBackendError", None)),
    (["usage: t.py [-h]", "t.py: error: unrecognized arguments: --x"], (None, None)),
    ([], (None, None)),
])
def test_failure_of_reads_tracebacks(tail: list[str], expected: tuple[str | None, str | None]) -> None:
    """The exception's class and innermost frame come from the last traceback in the lines."""
    failure = failure_of(1, None, tail)
    assert (failure.exception, failure.where) == expected


def test_signal_and_hang_are_never_deterministic() -> None:
    """Killed by a signal or hung: restart, whatever came before."""
    rule = RestartOnSpec()
    killed = failure_of(137, "SIGKILL", ["NameError: x"])
    assert will_repeat(killed, False, killed, 0, rule) is None
    hung = Failure(124, hang=True)
    assert will_repeat(hung, False, hung, 0, rule) is None


def test_an_attempt_without_any_progress_record_counts_as_progress_after_a_minute(tmp_path: Path) -> None:
    """A script that never calls heartbeat: after UNSEEN_PROGRESS_AFTER s its failure is not 'before any progress'."""
    from clusterddp.events import EventLog
    from clusterddp.launch.runlog import UNSEEN_PROGRESS_AFTER, RunLog

    now = [1000.0]
    runlog = RunLog(EventLog(str(tmp_path), None, "h"), clock=lambda: now[0])
    runlog.attempt_started(0, [(0, str(tmp_path / "hb0")), (1, str(tmp_path / "hb1"))])
    now[0] += 5
    assert not runlog.progressed()
    now[0] += UNSEEN_PROGRESS_AFTER
    assert runlog.progressed()
    runlog.close()
