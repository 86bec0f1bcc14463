"""Secrets never printed: tokens checked before use, env_passthrough by name (local run, SSH
plan, sbatch), and submit slurm hands sbatch none of the caller's allocation variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp import redact
from clusterddp.launch.ssh.attempt import head_launch_env
from clusterddp.launch.ssh.reach import LaunchPlan
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


# -- a worker that prints its secret: the console and the report mask it, the log keeps it ----

def leak(tmp_path: Path, mode: str, secret: str = SECRET) -> tuple[bytes, bytes]:
    """``clusterddp run`` of tests/bin/leak_secret.py MODE with CANARY_TOKEN passed through:
    (stdout, stderr) as bytes (a secret need not be UTF-8); the job fails (exit 1)."""
    job = write_job(tmp_path, script="leak_secret.py", args=["CANARY_TOKEN", mode], nproc_per_node=1,
                    env_passthrough=["CANARY_TOKEN"])
    run = subprocess.run([sys.executable, "-m", "clusterddp", "run", str(job)], cwd=tmp_path,
                         env=cli_env(CANARY_TOKEN=secret), capture_output=True, timeout=120)
    assert run.returncode == 1, run.stderr.decode(errors="replace")
    return run.stdout, run.stderr


def report_part(stderr: bytes) -> bytes:
    """The failure report: from its first line to the end of stderr."""
    start = stderr.find(b"clusterddp: job '")
    assert start >= 0, stderr.decode(errors="replace")
    return stderr[start:]


def test_report_last_lines_mask_a_printed_secret(tmp_path: Path) -> None:
    """The report's last lines show *** for a secret printed in two writes and for one the
    2000-character cut splits; the rank's log file keeps the raw bytes."""
    _, stderr = leak(tmp_path, "stream")
    report = report_part(stderr)
    assert b"last lines:" in report and b"split: *** end" in report, report.decode(errors="replace")
    assert SECRET[:5].encode() not in report, report.decode(errors="replace")
    assert b"x" * 1995 + b"***" in report
    log = next((tmp_path / "logs").rglob("rank0.log")).read_bytes()
    assert log.count(SECRET.encode()) == 3


def test_live_console_relay_masks_a_printed_secret(tmp_path: Path) -> None:
    """Relayed worker lines on stdout and stderr show *** where the worker printed the secret."""
    stdout, stderr = leak(tmp_path, "stream")
    console_err = stderr[:stderr.find(b"clusterddp: job '")]
    assert b"rank 0] token=***\n" in stdout and b"rank 0] split: *** end\n" in console_err, stdout + stderr
    assert SECRET[:5].encode() not in stdout + console_err


def test_console_cut_at_64k_masks_a_secret_it_splits(tmp_path: Path) -> None:
    """A secret across the console's 64 KiB cut: the shown piece ends in *** before the cut mark."""
    stdout, _ = leak(tmp_path, "long")
    assert b"y" * (64 * 1024 - 5) + b"*** [... line cut at 64 KiB" in stdout, stdout[-200:]
    assert SECRET[:5].encode() not in stdout


def test_unterminated_last_line_masks_the_start_of_a_secret(tmp_path: Path) -> None:
    """A worker gone halfway through printing its secret: the unterminated last line, on the
    console and in the report, ends in *** (the rest never came; the start is masked)."""
    stdout, stderr = leak(tmp_path, "half")
    assert b"rank 0] half: ***\n" in stdout and b"      half: ***\n" in report_part(stderr), stdout + stderr
    assert SECRET[:5].encode() not in stdout + stderr


def test_record_error_file_traceback_is_masked(tmp_path: Path) -> None:
    """The @record error file's message and traceback (a repr of the value) reach the report masked."""
    _, stderr = leak(tmp_path, "record", secret=SECRET + "'\\\"")
    report = report_part(stderr)
    assert b"ValueError: bad key '***'" in report, report.decode(errors="replace")
    assert SECRET[:5].encode() not in report


@pytest.mark.parametrize("secret", [
    pytest.param("k.*+?^$(x)[y]{2}|\\d-ab12", id="regex-metacharacters"),
    pytest.param("first-line-AAAA\nsecond-line-BBBB", id="newline-inside"),
    pytest.param("\udcff\udcfe-raw-bytes-7q3", id="not-utf8"),
    pytest.param("tab\there-and-\x1b[31mred", id="controls"),
])
def test_hard_secrets_are_masked_everywhere(tmp_path: Path, secret: str) -> None:
    """Metacharacters, a newline, undecodable bytes, control characters: no line of the value
    reaches stdout or stderr (console and report), raw or escaped."""
    stdout, stderr = leak(tmp_path, "stream", secret)
    shown = stdout + stderr
    raw = secret.encode("utf-8", "surrogateescape")
    pieces = [raw, *raw.split(b"\n"), secret.encode("unicode_escape"), raw.replace(b"\x1b", b"\\x1b")]
    assert not [piece for piece in pieces if piece in shown], shown.decode(errors="replace")
    assert b"token=***" in stdout


def test_dry_run_masks_a_secret_typed_into_args(tmp_path: Path) -> None:
    """A passthrough value also written into the job's args: the dry run's argv shows ***."""
    job = write_job(tmp_path, script="dump_env.py", args=["--key", SECRET], nproc_per_node=1,
                    env_passthrough=["CANARY_TOKEN"])
    dry = cli("run", str(job), "--dry-run", env=cli_env(CANARY_TOKEN=SECRET), cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "--key ***" in dry.stdout and SECRET not in dry.stdout + dry.stderr, dry.stdout


def test_short_values_are_not_masked() -> None:
    """A value under MIN_SECRET_CHARS is left alone: masking every "on" would garble all output."""
    redact.register("on1")
    assert redact.scrub("on1 and on1") == "on1 and on1"


def test_cut_masks_a_trailing_start_of_a_secret() -> None:
    """mask(cut=True): the start of a secret at the end of a cut piece is masked, even 1 byte."""
    redact.register("Zq-cut-secret-9")
    assert redact.mask(b"head Zq-cut", cut=True) == b"head ***"
    assert redact.mask(b"head Z", cut=True) == b"head ***"
    assert redact.mask(b"head Z") == b"head Z"


def test_ssh_head_console_masks_what_it_prints() -> None:
    """The head's Console masks a host's relayed line and its own report text, whatever the
    host's launcher did (one that knew no secrets, or cut the line elsewhere)."""
    import io

    from clusterddp.launch.ssh.io import Console

    redact.register("head-only-secret-77")
    out, err = io.BytesIO(), io.BytesIO()
    console = Console(out, err)
    console.relay(None, "out", b"[cdssh1 rank 0] key head-only-secret-77\n")  # type: ignore[arg-type]
    console.write_err("      last line: head-only-secret-77\n")
    assert out.getvalue() == b"[cdssh1 rank 0] key ***\n" and err.getvalue() == b"      last line: ***\n"


@pytest.mark.ssh
@pytest.mark.slow
def test_ssh_head_masks_relayed_lines_and_the_remote_report(tmp_path: Path) -> None:
    """Over SSH (2 sshd hosts): the secret a remote worker prints is *** in the head's relayed
    lines and in the head's report of the remote root cause's last lines."""
    from tests.testbed import lab_unavailable_reason, ssh_lab

    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with ssh_lab(2) as lab:
        job = write_job(tmp_path, script="leak_secret.py", args=["CANARY_TOKEN", "stream"], nproc_per_node=1,
                        env_passthrough=["CANARY_TOKEN"],
                        ssh={"config_file": str(lab.ssh_config), "connect_timeout": 3})
        run = cli("run", str(job), "--hostfile", str(lab.hostfile), env=cli_env(CANARY_TOKEN=SECRET),
                  cwd=tmp_path, timeout=180)
    shown = run.stdout + run.stderr
    assert run.returncode == 1, shown
    assert "rank 0] token=***" in run.stdout and "last lines:" in run.stderr, shown
    assert "split: *** end" in run.stderr[run.stderr.find("last lines:"):], shown
    assert SECRET[:5] not in shown, shown
