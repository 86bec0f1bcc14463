"""``clusterddp run --marks-dir DIR``: the launcher leaves node<R>.started once placed and
node<R>.exit with its exit status, which the sbatch script reads instead of trusting srun."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import cli, write_job


@pytest.mark.parametrize("code", [0, 3])
def test_the_launcher_records_its_start_and_its_exit_status(tmp_path: Path, code: int) -> None:
    """A run whose worker exits CODE leaves node0.started naming its pid and node0.exit holding CODE."""
    job = write_job(tmp_path, script="exit_with.py", args=[str(code)], nproc_per_node=1)
    records = tmp_path / "records" / "0.0"
    result = cli("run", str(job), "--marks-dir", str(records))
    assert result.returncode == code, result.stderr
    assert (records / "node0.started").read_text().startswith("pid ")
    assert (records / "node0.exit").read_text() == f"{code}\n"


def test_a_launcher_that_fails_after_placing_itself_records_its_exit_status(tmp_path: Path) -> None:
    """A worker interpreter that does not exist stops the launcher with exit 2: both records are there, exit 2."""
    job = write_job(tmp_path, script="exit_with.py", args=["0"], nproc_per_node=1, python="/nonexistent/python3")
    records = tmp_path / "records"
    result = cli("run", str(job), "--marks-dir", str(records))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (records / "node0.started").exists()
    assert (records / "node0.exit").read_text() == "2\n"


def test_an_unwritable_marks_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """--marks-dir under a regular file: one error line naming the option, exit 2, no worker started."""
    (tmp_path / "file").write_text("")
    job = write_job(tmp_path, script="exit_with.py", args=["0"], nproc_per_node=1)
    result = cli("run", str(job), "--marks-dir", str(tmp_path / "file" / "records"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterddp: error: --marks-dir: node 0: "), result.stderr
    assert "rank 0 exiting" not in result.stderr
