"""The benchmarks' own commands run on a GPU node too (issue 32, item 13): launch_overhead.py's
workers join gloo, so its clusterddp jobs must say ``backend: gloo`` (``auto`` is nccl where a
GPU is visible, and 2 nccl workers on 1 GPU are refused)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO, cli_env


def _benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method", ["clusterddp", "clusterddp cold"])
def test_launch_overhead_jobs_use_gloo_on_a_gpu_node(method: str) -> None:
    """The benchmark's clusterddp command for 2 workers, dry-run on a node with 1 visible GPU: accepted, gloo."""
    bench = _benchmark("launch_overhead")
    argv = bench.METHODS[method](2, 29999) + ["--dry-run"]
    assert argv[:4] == [sys.executable, "-m", "clusterddp", "run"]
    done = subprocess.run(argv, env=cli_env(CUDA_VISIBLE_DEVICES="0"), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "nccl" not in done.stdout + done.stderr, done.stdout
    assert "CLUSTERDDP_BACKEND=gloo" in done.stdout, done.stdout


STAMP = ("import os, sys; open(os.path.join(sys.argv[1], 'killed'), 'w').write('0'); "
         "open(os.path.join(sys.argv[1], 'resumed'), 'w')"
         ".write('1' if os.environ.get('TORCH_DISABLE_SHARE_RDZV_TCP_STORE') == '1' else '2')")


def test_restart_latency_gives_the_store_variable_to_its_named_row_only(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32, item 12: plain torchrun is a row of its own; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 reaches
    only the row that names it, even when the caller's environment has it."""
    bench = _benchmark("restart_latency")
    rows = bench.methods(str(tmp_path), str(tmp_path), 29990, None)
    torchruns = {name: row for name, row in rows.items() if "torch.distributed.run" in row.argv}
    assert set(torchruns) == {"torchrun", "torchrun, store not shared (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)"}
    assert [name for name, row in rows.items() if row.env] == [
        "torchrun, store not shared (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)"]
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The variable as each row's process sees it, read back through the benchmark's own runner.
    seen = {name: bench.latency([sys.executable, "-c", STAMP, str(tmp_path)], str(tmp_path), None, row.env)
            for name, row in rows.items()}
    assert seen == {name: 1.0 if row.env else 2.0 for name, row in rows.items()}, seen
