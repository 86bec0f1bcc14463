"""The built wheel works outside the checkout: console script, templates as package data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv_and_ships_templates(tmp_path: Path) -> None:
    """Build the wheel, install it (with its dependencies) in a new venv, run clusterddp there."""
    dist = tmp_path / "dist"
    # Build from a copy: setuptools' build/ directory keeps stale modules between builds.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "logs", "runs", "data", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("clusterddp-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "clusterddp/templates/slurm.sbatch" in names and "clusterddp/templates/openpai.yaml" in names
    modules = {str(p.relative_to(REPO)) for p in (REPO / "clusterddp").rglob("*.py")}
    assert modules <= set(names), sorted(modules - set(names))  # setup.cfg lists every package
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True, capture_output=True,
                   timeout=600)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    help_text = subprocess.run([str(venv / "bin" / "clusterddp"), "--help"], cwd=outside, check=True,
                               capture_output=True, text=True).stdout
    assert "run" in help_text and "render" in help_text
    loaded = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import clusterddp.templates as t, sys; print(t.__file__); "
         "print(len(t.load_template('slurm.sbatch')), len(t.load_template('openpai.yaml')))"],
        cwd=outside, check=True, capture_output=True, text=True).stdout.splitlines()
    assert str(venv) in loaded[0]
    assert all(int(n) > 0 for n in loaded[1].split())
