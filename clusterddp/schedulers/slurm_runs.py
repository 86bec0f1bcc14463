"""SLURM jobs after ``submit``: their state for ``clusterddp ls`` and ``status``, ``stop``
(scancel) and ``logs``, by job id or by the run id the registry gave them.

One question per ``ls`` for every SLURM run at once, never one per run: ``squeue`` (every job
of this user, finished ones too while slurmctld keeps them: ``MinJobAge``); for a job it no
longer knows, ``sacct`` once, where accounting exists; then the batch shell's own record
(``<logs.dir>/<job id>/launchers/outcome``, written by templates/slurm.sbatch as it exits), so a
job keeps its right final state without slurmdbd (TorchX's SLURM list lost such jobs). The
launchers' failure records of the last attempt give the root cause.

``stop`` is ``scancel JOBID``: SLURM sends SIGTERM to the batch shell and every step, the
launchers stop their workers within ``grace_period`` (their orderly teardown), and SLURM's
``KillWait`` later sends SIGKILL to what is left; ``stop`` warns when ``KillWait`` is shorter
than the job's grace period, since the teardown would then be cut.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from clusterddp.errors import ClusterDDPError, SubmitError
from clusterddp.redact import scrub
from clusterddp.registry import store
from clusterddp.registry.events import summarise
from clusterddp.registry.logs import one, rank_logs, show
from clusterddp.registry.store import RunRecord
from clusterddp.registry.view import live, merge, status_lines
from clusterddp.validate import clip, read_small_file, shown

#: The batch shell's record (clusterddp.schedulers.slurm.OUTCOME_FILE).
OUTCOME = "outcome"
#: SLURM's job states as the registry's.
STATES = {
    "PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending", "RESV_DEL_HOLD": "pending", "SPECIAL_EXIT": "failed",
    "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "running", "STOPPED": "running",
    "SIGNALING": "running", "STAGE_OUT": "running", "RESIZING": "running",
    "COMPLETED": "finished", "CANCELLED": "stopped", "PREEMPTED": "stopped",
    "FAILED": "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed", "DEADLINE": "failed", "REVOKED": "failed",
}
FINAL = frozenset({"finished", "failed", "stopped"})
JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")


@dataclass
class Outcome:
    """What SLURM (or the job's own records) say of one job now."""

    state: str
    exit_code: int | None = None
    root_cause: str = ""
    attempts: int | None = None
    hosts: list[str] = field(default_factory=list)
    #: Where it was learnt: squeue, sacct, the batch script's record.
    source: str = ""


def _run(argv: Sequence[str], env: Mapping[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str] | None:
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        return None
    try:
        return subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def squeue(env: Mapping[str, str]) -> dict[str, tuple[str, str]] | None:
    """job id -> (SLURM state, nodes) of every job of this user slurmctld still knows; None
    when SLURM cannot be asked (then nothing is concluded from a job's absence)."""
    done = _run(["squeue", "-h", "--me", "-t", "all", "-o", "%i|%T|%N"], env)
    if done is None or done.returncode != 0:
        return None
    jobs: dict[str, tuple[str, str]] = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            jobs[parts[0]] = (parts[1], parts[2])
    return jobs


def sacct(job_ids: Sequence[str], env: Mapping[str, str]) -> dict[str, tuple[str, int | None]]:
    """job id -> (state, exit code) from accounting; empty without slurmdbd (sacct refuses)."""
    if not job_ids:
        return {}
    done = _run(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobIDRaw,State,ExitCode"], env)
    if done is None or done.returncode != 0:
        return {}
    found: dict[str, tuple[str, int | None]] = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in job_ids:
            code = parts[2].split(":")[0]
            found[parts[0]] = (parts[1].split()[0] if parts[1] else "", int(code) if code.isdigit() else None)
    return found


def recorded(run_dir: str) -> Outcome | None:
    """The batch script's record of the job's end, with the launchers' root cause; None
    without it (the shell was killed: scancel, its node lost)."""
    launchers = os.path.join(run_dir, "launchers")
    try:
        raw = read_small_file(os.path.join(launchers, OUTCOME), 256).decode("ascii", "replace").split()
    except (OSError, ValueError):
        return None
    if not raw or not raw[0].isdigit():
        return None
    status = int(raw[0])
    last = int(raw[1]) if len(raw) > 1 and raw[1].isdigit() else None
    cause = (root_cause(launchers) or summarise(run_dir).root_cause) if status else ""
    return Outcome("finished" if status == 0 else "failed", status, cause,
                   attempts=None if last is None else last + 1, source="the batch script's record")


def root_cause(launchers: str) -> str:
    """The earliest failure the launchers recorded in the last attempt's directory."""
    attempts = sorted(glob.glob(os.path.join(glob.escape(launchers), "*.*")), key=_attempt_key)
    if not attempts:
        return ""
    first: tuple[int, str] | None = None
    for path in glob.glob(os.path.join(glob.escape(attempts[-1]), "node*.failure")):
        try:
            text = read_small_file(path, 4096).decode("utf-8", "replace").splitlines()[0]
        except (OSError, ValueError, IndexError):
            continue
        parts = text.split(" ", 3)
        if len(parts) == 4 and parts[0].isdigit() and (first is None or int(parts[0]) < first[0]):
            first = (int(parts[0]), parts[3])
    return clip(scrub(first[1]), 300) if first else ""


def _attempt_key(path: str) -> tuple[int, int]:
    name = os.path.basename(path)
    restart, _, attempt = name.partition(".")
    return (int(restart) if restart.isdigit() else -1, int(attempt) if attempt.isdigit() else -1)


def outcomes(jobs: Mapping[str, str], env: Mapping[str, str]) -> dict[str, Outcome]:
    """job id -> Outcome for ``jobs`` (job id -> its run dir): one squeue, at most one sacct,
    then each job's own record. A job SLURM cannot be asked about is left out."""
    queue = squeue(env)
    if queue is None:
        return {}
    found: dict[str, Outcome] = {}
    for job_id, run_dir in jobs.items():
        if job_id in queue:
            slurm_state, nodes = queue[job_id]
            state = STATES.get(slurm_state.split()[0].rstrip("+"), "running")
            outcome = Outcome(state, hosts=[nodes] if nodes and nodes != "(null)" else [], source="squeue")
            if state in FINAL:  # the batch script's record has the exit status and the cause
                mine = recorded(run_dir)
                if mine is not None:
                    outcome.exit_code, outcome.root_cause, outcome.attempts = (mine.exit_code, mine.root_cause,
                                                                               mine.attempts)
            found[job_id] = outcome
    gone = [job_id for job_id in jobs if job_id not in queue]
    accounted = sacct(gone, env)
    for job_id in gone:
        mine = recorded(jobs[job_id])
        if job_id in accounted:
            state, code = accounted[job_id]
            outcome = Outcome(STATES.get(state, "failed"), code, source="sacct")
            if mine is not None:
                outcome.root_cause, outcome.attempts = mine.root_cause, mine.attempts
            found[job_id] = outcome
        elif mine is not None:
            found[job_id] = mine
        else:
            found[job_id] = Outcome("failed", root_cause="left SLURM without a record of its end (cancelled, "
                                    "or its batch node was lost)", source="none")
    return found


def kill_wait(env: Mapping[str, str]) -> float | None:
    """SLURM's KillWait (seconds from SIGTERM to SIGKILL), None when it cannot be read."""
    done = _run(["scontrol", "show", "config"], env)
    if done is None or done.returncode != 0:
        return None
    match = re.search(r"^KillWait\s*=\s*([0-9]+)", done.stdout, re.M)
    return float(match.group(1)) if match else None


def scancel(job_id: str, env: Mapping[str, str]) -> None:
    """``scancel JOBID``: SIGTERM to the batch shell and every step, SIGKILL after KillWait."""
    done = _run(["scancel", job_id], env)
    if done is None:
        raise SubmitError("scancel is not on PATH", "run this on a SLURM login node")
    if done.returncode != 0:
        raise SubmitError(f"scancel {job_id} failed: {clip(scrub(done.stderr.strip()), 300)}")


def wait_gone(job_id: str, env: Mapping[str, str], timeout: float) -> str | None:
    """Poll squeue until the job is in a final state; that state, or None at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = squeue(env)
        if queue is not None:
            state = queue.get(job_id)
            if state is None:
                return "gone"
            if STATES.get(state[0].split()[0].rstrip("+")) in FINAL:
                return state[0]
        time.sleep(0.5)
    return None


def refresh(records: Sequence[RunRecord], env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """run id -> changed fields for these SLURM runs (one squeue for all); a state that became
    final is written into the record, so it stays right after SLURM forgets the job."""
    jobs = {r.job_id: r.run_dir for r in records if r.job_id and JOB_ID.fullmatch(r.job_id)}
    found = outcomes(jobs, env)
    changes: dict[str, dict[str, Any]] = {}
    for record in records:
        outcome = found.get(record.job_id)
        if outcome is None:
            continue
        state = outcome.state
        if state == "failed" and outcome.source == "none" and record.stop_requested is not None:
            state, outcome.root_cause = "stopped", ""
        if state in FINAL and record.stop_requested is not None and outcome.exit_code not in (0, None):
            state = "stopped"
        change: dict[str, Any] = {"state": state}
        for key, value in (("exit_code", outcome.exit_code), ("root_cause", outcome.root_cause),
                           ("attempts", outcome.attempts), ("hosts", outcome.hosts or None)):
            if value not in (None, ""):
                change[key] = value
        if state in FINAL and record.ended is None:
            change["ended"] = store.now()
        changes[record.run_id] = change
        if state in FINAL or state != record.state:
            try:
                store.update(record.run_id, **change)
            except (ClusterDDPError, OSError):
                pass
    return changes


def record_of(job_id: str) -> RunRecord:
    """The registry's record of SLURM job ``job_id`` (``submit`` wrote it)."""
    if not JOB_ID.fullmatch(job_id):
        raise ClusterDDPError(f"slurm: job id {shown(job_id)}: expected digits (an array task: 123_4)")
    return store.find(f"slurm-{job_id}")


def status(job_id: str, env: Mapping[str, str]) -> int:
    """The job's row, as ``clusterddp ls`` has it now."""
    record = record_of(job_id)
    row = live(record)
    merge([row], refresh([record], env))
    for line in status_lines(row, store.now()):
        print(line)
    return 0


def stop(job_id: str, env: Mapping[str, str], wait: float = 120.0) -> int:
    """scancel (see the module's docstring); waits for SLURM to end the job."""
    record = record_of(job_id)
    before = refresh([record], env).get(record.run_id, {}).get("state", record.state)
    if before in FINAL:
        print(f"clusterddp: run {record.run_id} (SLURM job {job_id}) has already ended ({before}): nothing to stop")
        return 0
    store.update(record.run_id, stop_requested=store.now())
    grace = _grace(record)
    killwait = kill_wait(env)
    if grace is not None and killwait is not None and killwait < grace:
        print(f"clusterddp: warning: SLURM's KillWait ({killwait:.0f}s) is shorter than the job's grace_period "
              f"({grace:.0f}s): SIGKILL may cut the workers' teardown", file=sys.stderr)
    scancel(job_id, env)
    print(f"clusterddp: asked SLURM to cancel job {job_id} (run {record.run_id}): SIGTERM to every step, "
          f"SIGKILL after KillWait")
    state = wait_gone(job_id, env, wait)
    refreshed = refresh([store.find(record.run_id)], env).get(record.run_id, {})
    print(f"clusterddp: run {record.run_id}: {refreshed.get('state', state or 'still stopping')}")
    return 0 if state is not None else 1


def _grace(record: RunRecord) -> float | None:
    if not record.job_file:
        return None
    try:
        from clusterddp.spec import load_job

        return float(load_job(record.job_file).grace_period)
    except (ClusterDDPError, OSError, ValueError):
        return None


def logs(job_id: str, env: Mapping[str, str], follow: bool, rank: int | None) -> int:
    """The batch log (every rank's lines, as srun relays them), or one rank's own log."""
    record = record_of(job_id)
    if rank is not None:
        sources = rank_logs(record.run_dir, rank)
    elif record.console:
        sources = one(record.console)
    else:
        raise ClusterDDPError(f"logs: run {record.run_id} has no batch log recorded; try --rank R")

    def alive() -> bool:
        outcome = outcomes({job_id: record.run_dir}, env).get(job_id)
        return outcome is not None and outcome.state not in FINAL

    return show(sources, follow, alive)
