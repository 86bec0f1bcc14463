"""A finished job exits 0: the gloo abort at interpreter exit (pytorch#190489) does not happen."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import cli, write_job


@pytest.mark.slow
def test_a_script_that_never_destroys_its_group_exits_0(tmp_path: Path) -> None:
    """5 runs of a 2-worker gloo script without destroy_process_group (CPU-pinned): every run exits 0, output whole."""
    job = write_job(tmp_path, script="gloo_no_destroy.py", nproc_per_node=2)
    codes = []
    for _ in range(5):
        result = cli("run", str(job), timeout=180)
        codes.append(result.returncode)
        assert "SIGABRT" not in result.stderr, result.stderr
        assert "rank 0 done 1048576" in result.stdout + result.stderr
        assert "rank 1 done 1048576" in result.stdout + result.stderr
    assert codes == [0] * 5
