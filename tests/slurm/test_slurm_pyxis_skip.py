"""Without pyxis, the pyxis tests skip before anything is built or started (issue 32)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_pyxis_tests_skip_before_the_image_and_the_cluster(tmp_path: Path) -> None:
    """With CLUSTERDDP_TEST_PYXIS unset, the five pyxis tests of test_slurm_oci.py skip
    without setting up the image (``bundle``) or the SLURM cluster (``cluster``): the skip is
    decided at collection, not after minutes of building and starting."""
    env = {key: value for key, value in os.environ.items() if key != "CLUSTERDDP_TEST_PYXIS"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/slurm/test_slurm_oci.py", "-k", "pyxis", "--setup-show", "-rs",
         "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'base'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 skipped" in result.stdout, result.stdout
    for fixture in ("bundle", "cluster", "runtime"):
        assert f" {fixture}" not in "\n".join(line for line in result.stdout.splitlines() if "SETUP" in line), \
            result.stdout
