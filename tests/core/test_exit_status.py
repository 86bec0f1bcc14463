"""A worker's exit status is the one ``python script.py`` gives, for every value SystemExit can
carry (CPython's _Py_HandleSystemExit): warm, cold, and through the bootstrap alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp.launch.start import bootstrap
from clusterddp.launch.observe.marks import exit_code_of
from tests.conftest import BIN, start_cli, write_job

#: Every rule of the interpreter: None; ints in a byte, past it, negative, at and past the
#: edges of int32 and of a C long (PyLong_AsLong gives -1 past it: 255, never the low bits);
#: bools and int subclasses (ints); str and other objects (printed, 1).
VALUES = ["None", "0", "1", "3", "255", "256", "257", "-1", "-256", "2**31", "2**32", "2**32+3",
          "2**63-1", "2**63", "-2**63", "-2**63-1", "2**70", "-2**70", "2**64", "True", "False",
          "BigInt(2**63)", "BigInt(7)", "'a message'", "''", "3.5", "[1, 2]", "Odd()"]


def _direct(value: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BIN / "exit_value.py"), value], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("value", VALUES)
def test_the_bootstrap_exits_as_python_does(value: str) -> None:
    direct = _direct(value)
    booted = subprocess.run([sys.executable, bootstrap.__file__, str(BIN / "exit_value.py"), value],
                            capture_output=True, text=True, timeout=600)
    assert (booted.returncode, booted.stderr) == (direct.returncode, direct.stderr)


@pytest.mark.parametrize("value", VALUES)
def test_the_cli_records_the_status_python_gives(value: str) -> None:
    """``exit_code_of`` (the launcher's own exit record) maps SystemExit as Python's main."""
    code = eval(value, {"BigInt": int, "Odd": object})
    assert exit_code_of(SystemExit(code)) == _direct(value).returncode


@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
@pytest.mark.parametrize("value, status", [("2**63", 255), ("-2**70", 255), ("2**32", 0), ("2**32+3", 3)])
def test_a_worker_that_exits_past_a_c_long_fails_the_run(tmp_path: Path, warm: bool, value: str,
                                                         status: int) -> None:
    """SystemExit(2**63) ended a worker with 0, so the run reported success."""
    job = write_job(tmp_path, script="exit_value.py", args=[value], nproc_per_node=1, warm_start=warm)
    proc = start_cli("run", str(job))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == status, err
    assert status == 0 or f"exit code {status}" in err or f"exited with {status}" in err, err
