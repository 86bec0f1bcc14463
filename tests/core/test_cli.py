"""The CLI end to end: hello job, torchrun parity, dry run, env, and the torch-free launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, cli, cli_env


def test_launcher_does_not_import_torch() -> None:
    """Importing the CLI (and running the launcher's modules) never pulls in torch."""
    code = ("import sys, clusterddp.cli, clusterddp.launch.local, clusterddp.launch.start.plan, clusterddp.envs; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", ["2", "4"])
def test_hello_job_runs(nproc: str, tmp_path: Path) -> None:
    """jobs/hello.yaml exits 0 with N gloo workers whose all_reduce sums agree."""
    result = cli("run", str(REPO / "jobs" / "hello.yaml"), "--nproc-per-node", nproc, "--log-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    n = int(nproc)
    lines = [line for line in result.stdout.splitlines() if "hello from rank" in line]
    assert len(lines) == n
    assert all(f"sum {n * (n - 1) // 2} ==" in line for line in lines)


@pytest.mark.slow
def test_torchrun_style_command_without_job_file(tmp_path: Path) -> None:
    """run --nproc-per-node 2 -- script args: no job file, like torchrun."""
    result = cli("run", "--nproc-per-node", "2", "--log-dir", str(tmp_path), "--",
                 str(BIN / "dump_env.py"), str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "rank1.json").read_text())["argv"][1:] == [str(tmp_path)]


@pytest.mark.slow
def test_same_env_contract_as_real_torchrun(tmp_path: Path) -> None:
    """A worker cannot tell clusterddp from torchrun: same contract names, same values."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    env = cli_env()
    env.pop("OMP_NUM_THREADS")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1",
                    "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", "29561", "--rdzv-id", "same",
                    str(BIN / "dump_env.py"), str(theirs)], env=env, check=True, capture_output=True, timeout=120)
    result = cli("run", "--nproc-per-node", "2", "--master-port", "29561", "--run-id", "same",
                 "--log-dir", str(tmp_path / "logs"), "--", str(BIN / "dump_env.py"), str(ours), env=env)
    assert result.returncode == 0, result.stderr
    contract = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                "OMP_NUM_THREADS")
    for rank in (0, 1):
        a = json.loads((ours / f"rank{rank}.json").read_text())["env"]
        b = json.loads((theirs / f"rank{rank}.json").read_text())["env"]
        torch_names = {k for k in b if k not in os.environ and not k.startswith(("TORCHELASTIC_ERROR", "PYTHON"))}
        assert torch_names <= set(a), torch_names - set(a)
        for key in contract:
            if key == "OMP_NUM_THREADS":
                continue  # torchrun: 1; clusterddp: cores / workers (documented)
            if key == "TORCHELASTIC_USE_AGENT_STORE":
                # torchrun's static agent hosts the TCPStore itself ("True"); clusterddp does not,
                # so rank 0 must host it: "False", as torchrun also says in its c10d mode.
                assert a[key] == "False"
                continue
            assert a.get(key) == b.get(key), (key, a.get(key), b.get(key))
        assert "TORCHELASTIC_ERROR_FILE" in a and "TORCHELASTIC_ERROR_FILE" in b


def test_dry_run_starts_nothing_and_shows_everything(tmp_path: Path) -> None:
    """--dry-run prints the rank table, argv and per-worker env, and creates no log."""
    result = cli("run", str(REPO / "jobs" / "hello.yaml"), "--nnodes", "2", "--node-rank", "1",
                 "--master-addr", "10.0.0.5", "--master-port", "29512", "--dry-run", "--log-dir", str(tmp_path / "l"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "world size 4" in out and "master 10.0.0.5:29512" in out
    assert "1  " in out and "2-3  <- this node" in out
    bootstrap = REPO / "clusterddp" / "launch" / "start" / "bootstrap.py"
    assert f"argv: {sys.executable} {bootstrap} {REPO / 'jobs' / 'hello.py'}" in out
    assert "RANK=3" in out and "GROUP_RANK=1" in out and "MASTER_PORT=29512" in out
    assert not (tmp_path / "l").exists()


def test_env_command_json() -> None:
    """clusterddp env --json shows the detected environment and topology."""
    env = cli_env(MASTER_ADDR="10.1.1.1", MASTER_PORT="1234", GROUP_RANK="1", GROUP_WORLD_SIZE="3",
                  LOCAL_WORLD_SIZE="2")
    result = cli("env", "--json", env=env)
    data = json.loads(result.stdout)
    assert data["env"] == "torchrun" and data["nnodes"] == 3 and data["node_rank"] == 1
    assert data["master_addr"] == "10.1.1.1" and data["master_port"] == 1234 and data["nproc_per_node"] == 2
    text = cli("env").stdout
    assert "environment: local" in text and "known environments" in text


def test_python_m_and_help() -> None:
    """python -m clusterddp --help works, lists the commands and names every platform (Kubernetes too)."""
    result = cli("--help")
    assert result.returncode == 0 and "run" in result.stdout and "submit" in result.stdout
    assert all(platform in result.stdout for platform in ("SSH", "SLURM", "OpenPAI", "Kubernetes")), result.stdout


def test_job_and_command_together_is_an_error() -> None:
    """A job file and a command after -- are mutually exclusive: one line, exit 2."""
    result = cli("run", str(REPO / "jobs" / "hello.yaml"), "--", "x.py")
    assert result.returncode == 2 and "not both" in result.stderr
