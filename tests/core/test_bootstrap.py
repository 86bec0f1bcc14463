"""The worker bootstrap: the script sees what `python script.py` shows it, and ends as Python
ends it, minus interpreter finalization (os._exit)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp.launch.start import bootstrap
from tests.conftest import BIN

BOOT = bootstrap.__file__


def _both(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    direct = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    booted = subprocess.run([sys.executable, BOOT, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    return direct, booted


def test_a_script_sees_what_python_script_py_shows_it() -> None:
    """__main__'s names and their order, __cached__ None, __annotations__, argv, orig_argv, path."""
    direct, booted = _both(["main_view.py", "a b", "'c'"], BIN)
    assert direct.returncode == booted.returncode == 0, booted.stderr
    view = json.loads(booted.stdout)
    assert view == json.loads(direct.stdout)
    assert view["cached"] == "None" and view["annotations"] == "{'level': <class 'int'>}"
    assert view["orig_argv"] == [sys.executable, "main_view.py", "a b", "'c'"]


def test_a_module_sees_what_python_m_shows_it() -> None:
    """`-m pkg.mod`: the same __main__ (__spec__, __cached__, __package__), argv, orig_argv, path."""
    direct, booted = _both(["-m", "viewpkg.view", "x"], BIN)
    assert direct.returncode == booted.returncode == 0, booted.stderr
    view = json.loads(booted.stdout)
    assert view == json.loads(direct.stdout)
    assert view["spec"] == "viewpkg.view" and view["cached"].endswith(".pyc'")
    assert view["orig_argv"] == [sys.executable, "-m", "viewpkg.view", "x"]


@pytest.mark.parametrize("target", [["main_view.py"], ["-m", "viewpkg.view"]])
def test_a_traceback_has_no_bootstrap_frame(target: list[str]) -> None:
    """An uncaught exception prints the same traceback as python (runpy's frames for -m), exit 1."""
    direct, booted = _both([*target, "raise"], BIN)
    assert direct.returncode == booted.returncode == 1
    assert booted.stderr == direct.stderr
    assert "bootstrap" not in booted.stderr


@pytest.mark.parametrize("how, code", [("return", 0), ("exit3", 3), ("exitmsg", 1), ("raise", 1),
                                       ("interrupt", -signal.SIGINT)])
def test_an_ending_keeps_what_python_shutdown_does(tmp_path: Path, how: str, code: int) -> None:
    """atexit ran, a non-daemon thread joined, unclosed and logging files and stdout complete."""
    for kind in ("direct", "booted"):
        (tmp_path / kind).mkdir()
    args = [str(BIN / "ending.py")]
    direct = subprocess.run([sys.executable, *args, str(tmp_path / "direct"), how], capture_output=True, text=True,
                            timeout=600)
    booted = subprocess.run([sys.executable, BOOT, *args, str(tmp_path / "booted"), how], capture_output=True,
                            text=True, timeout=600)
    assert direct.returncode == booted.returncode == code, booted.stderr
    files = {"atexit": "ran\n", "unclosed": "all of it\n", "logged": "logged line\n", "thread": "joined\n"}
    for name, text in files.items():
        assert (tmp_path / "direct" / name).read_text() == text
        assert (tmp_path / "booted" / name).read_text() == text, name
    assert booted.stdout == direct.stdout.replace("finalized\n", "")
    assert booted.stderr == direct.stderr


def test_finalizers_do_not_run_at_exit(tmp_path: Path) -> None:
    """What a script can no longer rely on: __del__ of an object alive at exit (python runs it)."""
    direct, booted = _both([str(BIN / "ending.py"), str(tmp_path), "return"], tmp_path)
    assert "finalized" in direct.stdout
    assert "finalized" not in booted.stdout


def test_a_syntax_error_reads_as_under_python(tmp_path: Path) -> None:
    """A script that does not compile: the same lines as python (no 'Traceback' header, no frame), exit 1."""
    (tmp_path / "broken.py").write_text("x = 1\ny = (\n")
    direct, booted = _both(["broken.py"], tmp_path)
    assert direct.returncode == booted.returncode == 1
    assert booted.stderr == direct.stderr and "SyntaxError" in booted.stderr
