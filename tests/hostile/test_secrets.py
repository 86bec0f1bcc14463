"""Secrets never printed: tokens checked before use, env_passthrough by name (local run, SSH
plan, sbatch), and submit slurm hands sbatch none of the caller's allocation variables."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clusterddp import redact
from clusterddp.launch.ssh.fanout import head_launch_env
from clusterddp.launch.ssh.remote_command import LaunchPlan
from clusterddp.spec import JobSpec
from tests.conftest import REPO, cli, cli_env, write_job

SECRET = "canary-secret-6f1d2c9a"
JOB = str(REPO / "jobs" / "cifar10.yaml")


def every_file_text(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("how", ["file", "variable"])
def test_two_line_token_is_one_line_and_never_shown(tmp_path: Path, how: str) -> None:
    """A token with an inner newline: one error line, exit 2, the token nowhere in the output."""
    token = f"{SECRET}\nsecond-line-of-{SECRET}"
    env = cli_env()
    args = ["submit", "openpai", JOB, "--url", "http://127.0.0.1:9/"]
    if how == "file":
        (tmp_path / "two-line.txt").write_text(token + "\n")
        args += ["--token-file", str(tmp_path / "two-line.txt")]
    else:
        env["CLUSTERDDP_OPENPAI_TOKEN"] = token
    result = cli(*args, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "token: has a line break" in result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_scrub_masks_raw_and_escaped_forms() -> None:
    """A registered secret is masked raw, as a repr would escape it, and line by line."""
    redact.register("tok-A1\nB2-tok")
    text = "Bearer tok-A1\\nB2-tok | tok-A1 | B2-tok"
    assert redact.scrub(text) == f"Bearer {redact.MASK} | {redact.MASK} | {redact.MASK}"


def test_passthrough_reaches_the_worker_and_no_output(tmp_path: Path) -> None:
    """A local run: the worker sees the variable; no console line, dry run or log file holds it."""
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(tmp_path, script="dump_env.py", args=[str(out)], nproc_per_node=1,
                    env_passthrough=["CANARY_TOKEN"])
    env = cli_env(CANARY_TOKEN=SECRET)
    run = cli("run", str(job), env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "rank0.json").read_text())["env"]["CANARY_TOKEN"] == SECRET
    dry = cli("run", str(job), "--dry-run", env=env, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert SECRET not in run.stdout + run.stderr + dry.stdout + dry.stderr
    assert SECRET not in every_file_text(tmp_path / "logs")


def test_unset_passthrough_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    """A listed variable missing from the environment: one line, exit 2, no log dir, no worker."""
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(tmp_path, script="dump_env.py", args=[str(out)], nproc_per_node=1,
                    env_passthrough=["CANARY_TOKEN"])
    for args in (["run", str(job)], ["submit", "slurm", str(job), "--dry-run"]):
        result = cli(*args, env=cli_env(), cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "CANARY_TOKEN is not set" in result.stderr
    assert not (tmp_path / "logs").exists() and not list(out.iterdir())


def test_sbatch_gets_names_not_values_and_no_allocation_vars(tmp_path: Path) -> None:
    """submit slurm: the script holds only the name (--export), sbatch's environment holds the
    value but none of the caller's SLURM_*/SBATCH_*/PMIX_*/SALLOC_*/SRUN_* variables."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f'#!/bin/sh\nenv -0 > {tmp_path}/sbatch.env\ncp "$2" {tmp_path}/seen.sbatch\necho 42\n')
    (fake / "sbatch").chmod(0o755)
    job = write_job(tmp_path, script="dump_env.py", env_passthrough=["CANARY_TOKEN"])
    leaked = {"SLURM_CPU_BIND": "quiet,mask_cpu:0xF", "SLURM_JOB_ID": "9", "SBATCH_EXPORT": "NONE",
              "PMIX_RANK": "0", "SALLOC_PARTITION": "x", "SRUN_CPUS_PER_TASK": "4", "SLURM_CONF": "/etc/slurm/slurm.conf"}
    env = cli_env(CANARY_TOKEN=SECRET, PATH=f"{fake}:{os.environ['PATH']}")
    env.update(leaked)
    result = cli("submit", "slurm", str(job), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    seen = dict(item.split("=", 1) for item in (tmp_path / "sbatch.env").read_text().split("\0")[:-1])
    assert seen["CANARY_TOKEN"] == SECRET and seen["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert not {k for k in seen if k.startswith(("SLURM_", "SBATCH_", "PMIX_", "SALLOC_", "SRUN_"))} - {"SLURM_CONF"}
    script = (tmp_path / "seen.sbatch").read_text()
    assert "#SBATCH --export=ALL,CANARY_TOKEN" in script
    assert SECRET not in script + result.stdout + result.stderr + every_file_text(tmp_path / "logs")
    dry = cli("submit", "slurm", str(job), "--dry-run", env=env, cwd=tmp_path)
    rendered = cli("render", "slurm", str(job), env=env, cwd=tmp_path)
    assert SECRET not in dry.stdout + dry.stderr + rendered.stdout + rendered.stderr


def test_ssh_plan_forwards_the_value_but_shows_a_reference() -> None:
    """Over SSH the head forwards the value to the stub (JSON), but the dry run's shell line
    names the variable instead."""
    job = JobSpec(name="j", script="t.py", env_passthrough=("CANARY_TOKEN",), env={"A": "1"})
    env = head_launch_env(job, {"CANARY_TOKEN": SECRET, "NCCL_DEBUG": "INFO", "HOME": "/root"})
    assert env == {"CANARY_TOKEN": SECRET, "NCCL_DEBUG": "INFO", "A": "1"}
    plan = LaunchPlan(host="h", node_rank=0, nproc=1, argv=("py", "-m", "clusterddp"), env=env,
                      passthrough=job.env_passthrough)
    assert plan.message()["env"]["CANARY_TOKEN"] == SECRET
    assert 'CANARY_TOKEN="$CANARY_TOKEN"' in plan.shell_line() and SECRET not in plan.shell_line()


def test_ssh_head_refuses_an_unset_passthrough() -> None:
    """The head checks env_passthrough before contacting any host."""
    from clusterddp.errors import JobSpecError

    job = JobSpec(name="j", script="t.py", env_passthrough=("CANARY_TOKEN",))
    with pytest.raises(JobSpecError, match="CANARY_TOKEN is not set"):
        head_launch_env(job, {})


@pytest.mark.parametrize("argv", [["render", "slurm"], ["render", "slurm", "x.yaml", "--bogus"],
                                  ["submit", "openpai", "x.yaml", "--timeout", "soon"]])
def test_scheduler_flag_errors_are_one_line(argv: list[str]) -> None:
    """argparse mistakes of the scheduler actions: one error line, exit 2, no usage block."""
    result = cli(*argv)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("clusterddp: error: ")


def test_render_output_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    """-o to a missing directory or a directory: one line, exit 2."""
    for target in (tmp_path / "missing" / "x.sbatch", tmp_path):
        result = cli("render", "slurm", str(REPO / "tests" / "slurm" / "golden" / "minimal.yaml"), "-o", str(target))
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


def test_sbatch_gets_no_slurmd_variable(tmp_path: Path) -> None:
    """submit slurm: SLURMD_NODENAME (and any SLURM*-named variable but SLURM_CONF) never reaches sbatch."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f'#!/bin/sh\nenv -0 > {tmp_path}/sbatch.env\necho 42\n')
    (fake / "sbatch").chmod(0o755)
    job = write_job(tmp_path, script="dump_env.py")
    env = cli_env(PATH=f"{fake}:{os.environ['PATH']}", SLURMD_NODENAME="n7", SLURMRESTD_SECURITY="x",
                  SLURM_CONF="/etc/slurm/slurm.conf")
    result = cli("submit", "slurm", str(job), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    seen = dict(item.split("=", 1) for item in (tmp_path / "sbatch.env").read_text().split("\0")[:-1])
    assert {k for k in seen if k.startswith("SLURM")} == {"SLURM_CONF"}, seen
