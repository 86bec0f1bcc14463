"""A run records itself: one call when it starts, one when it ends (the CLI makes both around
the launch, so the launch code itself does not know the registry).

Recording is best effort: a registry that cannot be written (a full disk, a read-only home)
costs one warning line, never the run.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, Mapping

from clusterddp.atomicfile import WriteError
from clusterddp.errors import ClusterDDPError
from clusterddp.procid import this_process
from clusterddp.registry import store
from clusterddp.registry.events import summarise
from clusterddp.validate import clip


def _warn(what: str, exc: Exception) -> None:
    """One line; a stderr that cannot take it either (a detached run's console on the same
    full disk) loses the line, never the run's exit code."""
    try:
        print(f"clusterddp: warning: the run registry: {what}: {clip(str(exc), 300)}", file=sys.stderr, flush=True)
    except OSError:
        pass


def begin(target: str, run_id: str, job: str, run_dir: str, *, job_file: str | None = None,
          hosts: list[str] | None = None, job_id: str = "", where: str = "", state: str = "running",
          scheduler_options: Mapping[str, Any] | None = None, launcher: bool = True, console: str = "",
          detached: bool = False, env: Mapping[str, str] | None = None,
          head: Mapping[str, Any] | None = None) -> store.RunRecord | None:
    """Record a run that starts now (``launcher``: this process answers for it)."""
    record = store.RunRecord(
        run_id=run_id, target=target, job=job, run_dir=os.path.abspath(run_dir) if run_dir else "",
        job_file=os.path.abspath(job_file) if job_file else "", cwd=os.getcwd(),
        hosts=list(hosts) if hosts is not None else [socket.gethostname()], job_id=job_id, where=where,
        state=state, launcher=store.launcher_record(this_process()) if launcher else None,
        started=store.now(), scheduler_options=dict(scheduler_options or {}), console=console,
        detached=detached, head=dict(head or {}))
    try:
        store.save(record, env)
    except (WriteError, ClusterDDPError, OSError) as exc:
        _warn(f"cannot record run {run_id}", exc)
        return None
    return record


def end(record: store.RunRecord | None, exit_code: int, goodput: float | None = None,
        env: Mapping[str, str] | None = None) -> None:
    """Record how the run ended: its exit code, attempts and root cause from its events."""
    if record is None:
        return
    summary = summarise(record.run_dir)
    latest = _latest(record, env)
    stopped = latest is not None and latest.stop_requested is not None
    state = "finished" if exit_code == 0 else ("stopped" if stopped or summary.stopped or exit_code >= 128
                                               else "failed")
    changes: dict[str, Any] = {"state": state, "exit_code": exit_code, "ended": store.now(),
                               "attempts": max(summary.attempts, 1), "root_cause": summary.root_cause,
                               "goodput": goodput}
    if summary.hosts:
        changes["hosts"] = summary.hosts
    try:
        store.update(record.run_id, env, **changes)
    except (WriteError, ClusterDDPError, OSError) as exc:
        _warn(f"cannot record the end of run {record.run_id}", exc)


def _latest(record: store.RunRecord, env: Mapping[str, str] | None) -> store.RunRecord | None:
    try:
        return store.find(record.run_id, env)
    except ClusterDDPError:
        return None
