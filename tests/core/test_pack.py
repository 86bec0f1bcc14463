"""``clusterddp pack``: the launcher as one file that runs with a python that has neither
clusterddp nor PyYAML (an image with torch only), workers included (issue 18, item 3)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, cli, write_job

#: An interpreter outside the venv, run isolated and without site: no clusterddp, no PyYAML.
BARE = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = pytest.mark.skipif(BARE is None, reason="no /usr/bin/python3 to run the zipapp with")


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pack") / "clusterddp.pyz"
    result = cli("pack", "-o", str(path))
    assert result.returncode == 0, result.stderr
    assert f"wrote {path}" in result.stdout
    return path


def bare(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run([str(BARE), "-I", "-S", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_bare_python_has_neither_clusterddp_nor_yaml(tmp_path: Path) -> None:
    """The interpreter the other tests use really lacks both (else they would prove nothing)."""
    for module in ("clusterddp", "yaml"):
        result = bare("-c", f"import {module}", cwd=tmp_path)
        assert "ModuleNotFoundError" in result.stderr, (module, result.stderr)


def test_archive_holds_sources_pure_yaml_and_its_license(pyz: Path) -> None:
    """Sources and templates of clusterddp, PyYAML's .py files (no C extension), PyYAML's MIT license."""
    names = zipfile.ZipFile(pyz).namelist()
    assert "__main__.py" in names and "clusterddp/cli.py" in names and "clusterddp/train/__init__.py" in names
    assert "clusterddp/templates/slurm.sbatch" in names and "yaml/__init__.py" in names
    assert "licenses/PyYAML.txt" in names
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "clusterddp").rglob("*.py")}
    assert modules <= set(names), sorted(modules - set(names))  # subpackages too (schedulers/kubernetes/)
    assert not [n for n in names if n.endswith((".so", ".pyc"))]
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n") and os.access(pyz, os.X_OK)


def test_pack_is_reproducible(pyz: Path, tmp_path: Path) -> None:
    """The same sources pack to the same bytes (fixed times, sorted entries)."""
    again = tmp_path / "again.pyz"
    assert cli("pack", "-o", str(again)).returncode == 0
    assert again.read_bytes() == pyz.read_bytes()


def test_dry_run_and_render_from_the_archive(pyz: Path, tmp_path: Path) -> None:
    """'run --dry-run' and 'render slurm' work from the archive with the bare python."""
    job = tmp_path / "job.yaml"
    job.write_text(f"script: {REPO / 'tests' / 'bin' / 'dump_env.py'}\nnproc_per_node: 2\n")
    result = bare(str(pyz), "run", str(job), "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "WORLD_SIZE=2" in result.stdout
    rendered = bare(str(pyz), "render", "slurm", str(job), cwd=tmp_path)
    assert rendered.returncode == 0 and rendered.stdout.startswith("#!/bin/bash"), rendered.stderr


def test_two_workers_run_from_the_archive(pyz: Path, tmp_path: Path) -> None:
    """A real 2-worker run: both ranks get the torchrun contract, and each worker imports
    clusterddp (as clusterddp.train would be) from the archive itself."""
    out = tmp_path / "out"
    out.mkdir()
    worker = tmp_path / "worker.py"
    worker.write_text((REPO / "tests" / "bin" / "dump_env.py").read_text()
                      + "import clusterddp, clusterddp.train.atomic\n"
                      + "open(os.path.join(sys.argv[1], 'from' + os.environ['RANK']), 'w').write(clusterddp.__file__)\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"script: {worker}\nargs: [{out}]\nnproc_per_node: 2\ncpu_affinity: none\n")
    result = bare(str(pyz), "run", str(job), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        env = json.loads((out / f"rank{rank}.json").read_text())["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (str(rank), "2", str(rank))
        assert (out / f"from{rank}").read_text() == str(pyz / "clusterddp" / "__init__.py")


#: A python with torch but without clusterddp, as an image has it: the venv's base interpreter
#: with only the site-packages that hold torch on PYTHONPATH (whose .pth files, the editable
#: install's among them, are not read).
IMAGE_PYTHON = getattr(sys, "_base_executable", sys.executable)
_TORCH = importlib.util.find_spec("torch")
TORCH_SITE = os.path.dirname(os.path.dirname(str(_TORCH.origin))) if _TORCH else ""


def test_a_restart_from_the_archive_is_warm(pyz: Path, tmp_path: Path) -> None:
    """``python x.pyz run`` with real gloo workers, ``restarts: 1`` and a rank that fails once:
    the zygote runs from the archive (no 'warm start off'), and both attempts' workers are
    forked by it (their /proc/self/cmdline is the zygote's: ``x.pyz --clusterddp-zygote``),
    the launcher's children, importing clusterddp from the archive (issue 32, item 8)."""
    if not TORCH_SITE:
        pytest.skip("torch is not installed")
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(tmp_path, script="gloo_fail_once.py", args=[str(out)], restarts=1, cpu_affinity="none",
                    python=IMAGE_PYTHON)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": TORCH_SITE, "OMP_NUM_THREADS": "1",
           "NO_COLOR": "1", "CLUSTERDDP_NO_MERGE": "1"}
    assert subprocess.run([IMAGE_PYTHON, "-c", "import clusterddp"], env=env, cwd=tmp_path,
                          capture_output=True).returncode == 1  # no clusterddp but the archive's
    proc = subprocess.Popen([IMAGE_PYTHON, str(pyz), "run", str(job)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    print(err)
    assert "warm start off" not in err, err
    assert "restart 1 of 1" in err, err
    seen = [json.loads((out / f"rank{r}.attempt{a}.json").read_text()) for r in (0, 1) for a in (0, 1)]
    assert len({s["pid"] for s in seen}) == 4 and all(s["ppid"] == proc.pid for s in seen), seen
    assert all(s["cmdline"][1:3] == [str(pyz), "--clusterddp-zygote"] for s in seen), seen
    assert all(s["clusterddp"] == str(pyz / "clusterddp" / "__init__.py") and s["sum"] == 1.0 for s in seen), seen


def test_a_warm_worker_of_the_archive_cannot_be_told_from_a_cold_one(pyz: Path, tmp_path: Path) -> None:
    """probe_self.py from the archive, warm and cold: the same argv, orig_argv, __main__,
    sys.path, modules, signals, descriptors (what differs by design, as without the archive:
    tests/core/test_warm.py)."""
    if not TORCH_SITE:
        pytest.skip("torch is not installed")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": TORCH_SITE, "OMP_NUM_THREADS": "1",
           "NO_COLOR": "1", "CLUSTERDDP_NO_MERGE": "1"}
    seen = {}
    for warm in (False, True):
        out = tmp_path / f"out{warm}"
        out.mkdir()
        job = write_job(tmp_path, name=f"w{warm}", script="probe_self.py", args=[str(out), "x"], warm_start=warm,
                        cpu_affinity="none", python=IMAGE_PYTHON)
        result = subprocess.run([IMAGE_PYTHON, str(pyz), "run", str(job), "--run-id", "RUN"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0 and "warm start off" not in result.stderr, result.stderr
        seen[warm] = json.loads((out / "rank0.x.json").read_text().replace(f"out{warm}", "OUT"))
    cold, warm_ = seen[False], seen[True]
    assert cold["cmdline"][1:3] == [str(pyz), "--clusterddp-bootstrap"]
    assert warm_["cmdline"][1:3] == [str(pyz), "--clusterddp-zygote"]
    assert set(warm_["modules"]) == set(cold["modules"]), set(warm_["modules"]) ^ set(cold["modules"])
    # A cold worker of the archive holds a descriptor of it (python's run of the zip leaves it
    # open); a forked one has only its stdio and the stacks file, as a cold worker run by path.
    assert {k: v for k, v in cold["fds"].items() if v != str(pyz)} == warm_["fds"]
    for key in ("argv", "orig_argv", "path", "main_names", "signals", "sig_status", "name", "file"):
        assert warm_[key] == cold[key], key
    for side in (cold, warm_):
        side["main"]["__loader__"] = side["main"]["__loader__"].split(" object at ")[0]
    assert warm_["main"] == cold["main"]
