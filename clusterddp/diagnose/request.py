"""``clusterddp stacks``: ask a running launcher for every worker's stack, print the answer.

The launcher of a run writes ``logs/<run-id>/launcher.json`` (its pid); we send it
``STACKS_REQUEST_SIGNAL``, it signals its workers (an SSH head also asks every remote
launcher), groups the stacks, and writes ``stacks-*.txt`` beside the logs. The job goes on.
All three (the file, the signal, the report's name) are ``clusterddp.protocol``'s.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from clusterddp.errors import ClusterDDPError
from clusterddp.procid import NotTheProcess, ProcessIdentity, signal_process, valid_pid, why_not_running
from clusterddp.protocol import (LAUNCHER_FILE, STACKS_REQUEST_SIGNAL, BadLauncherFile, launcher_files,
                                 read_launcher_file, stacks_reports)
from clusterddp.validate import clip, escape_controls, shown


@dataclass(frozen=True)
class LauncherRecord:
    """A run's ``launcher.json``, checked: the process it names, and the run it answers for."""

    run_dir: str
    run_id: str
    process: ProcessIdentity


def _record(run_dir: str, data: dict[str, Any]) -> LauncherRecord:
    """``data`` as a record; BadLauncherFile when a field is not what a launcher writes
    (a pid of 0, -1, true or 1.5 would make ``kill`` reach a group or every process)."""
    pid = valid_pid(data.get("pid"))
    if pid is None:
        raise BadLauncherFile(f"has no valid pid (got {shown(data.get('pid'), 40)})")
    started, boot, host = data.get("start_time"), data.get("boot_id"), data.get("hostname")
    if type(started) is not int or started < 0:
        started = None
    run_id = data.get("run_id")
    return LauncherRecord(run_dir, run_id if isinstance(run_id, str) else os.path.basename(run_dir),
                          ProcessIdentity(pid, started, boot if isinstance(boot, str) else None,
                                          host if isinstance(host, str) else ""))


def _read(run_dir: str) -> LauncherRecord | None:
    data = read_launcher_file(run_dir)
    return None if data is None else _record(run_dir, data)


def _bad_file_line(run_dir: str, exc: BadLauncherFile) -> str:
    return f"{clip(os.path.join(run_dir, LAUNCHER_FILE), 200)}: {exc}"


def find_launcher(target: str | None, log_dir: str) -> LauncherRecord:
    """The checked launcher file of ``target`` (run id or dir), or of the newest run whose
    launcher is provably still running. A broken file found while searching is skipped with
    one line on stderr: one corrupt run must not hide every other."""
    if target:
        candidates = [target, os.path.join(log_dir, target)]
        for directory in candidates:
            try:
                found = _read(directory)
            except BadLauncherFile as exc:
                raise ClusterDDPError(f"cannot ask the run's launcher: {_bad_file_line(directory, exc)}") from None
            if found is not None:
                return found
        shown_candidates = " or ".join(clip(c, 200) for c in candidates)
        raise ClusterDDPError(f"no running job found at {shown_candidates} (no {LAUNCHER_FILE})")
    for path in launcher_files(log_dir):
        run_dir = os.path.dirname(path)
        try:
            found = _read(run_dir)
        except BadLauncherFile as exc:
            print(f"clusterddp: skipped {_bad_file_line(run_dir, exc)}", file=sys.stderr)
            continue
        if found is not None and why_not_running(found.process) is None:
            return found
    raise ClusterDDPError(f"no running clusterddp job found under {clip(log_dir, 200)}/",
                          "give the run id or its log directory: clusterddp stacks RUN_ID")


@dataclass(frozen=True)
class StacksOptions:
    """Which run to ask, and how long to wait for its answer."""

    #: Run id or log directory; None: the newest run under ``log_dir`` whose launcher is alive.
    target: str | None = None
    log_dir: str = "logs"
    timeout: float = 10.0


def stacks_main(options: StacksOptions) -> int:
    """Ask the run's launcher for every worker's stack; print the grouped report."""
    record = find_launcher(options.target, options.log_dir)
    run = clip(record.run_id)
    pid = record.process.pid
    before = stacks_reports(record.run_dir, pid)
    try:
        signal_process(record.process, STACKS_REQUEST_SIGNAL)
    except NotTheProcess as exc:
        raise ClusterDDPError(f"not signalling the launcher of run {run} (pid {pid}): {exc}",
                              "nothing was signalled; a stale launcher.json names a process that has ended") from None
    deadline = time.monotonic() + options.timeout
    while time.monotonic() < deadline:
        new = sorted(stacks_reports(record.run_dir, pid) - before)
        if new:
            time.sleep(0.1)  # the launcher writes the file in one go; let it finish
            with open(new[-1], encoding="utf-8", errors="replace") as f:
                # a worker's file or function name reaches the terminal as text, not as escapes
                print("\n".join(escape_controls(line) for line in f.read().splitlines()))
            print(f"(saved in {new[-1]})")
            return 0
        time.sleep(0.05)
    raise ClusterDDPError(f"no stacks from run {run} within {options.timeout:g}s")
