"""``clusterddp stacks``: ask a running launcher for every worker's stack, print the answer.

The launcher of a run writes ``logs/<run-id>/launcher.json`` (its pid); we send it
``STACKS_REQUEST_SIGNAL``, it signals its workers (an SSH head also asks every remote
launcher), groups the stacks, and writes ``stacks-*.txt`` beside the logs. The job goes on.
All three (the file, the signal, the report's name) are ``clusterddp.protocol``'s.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from clusterddp.errors import ClusterDDPError
from clusterddp.validate import clip
from clusterddp.protocol import (LAUNCHER_FILE, STACKS_REQUEST_SIGNAL, launcher_files, read_launcher_file,
                                 stacks_reports)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def find_launcher(target: str | None, log_dir: str) -> tuple[str, dict[str, Any]]:
    """The run directory and launcher.json of ``target`` (run id or dir), or the newest live run."""
    if target:
        candidates = [target, os.path.join(log_dir, target)]
        for directory in candidates:
            found = read_launcher_file(directory)
            if found is not None:
                return directory, found
        raise ClusterDDPError(f"no running job found at {' or '.join(clip(c) for c in candidates)} (no {LAUNCHER_FILE})")
    for path in launcher_files(log_dir):
        data = read_launcher_file(os.path.dirname(path))
        if data is not None and _alive(int(data.get("pid", 0))):
            return os.path.dirname(path), data
    raise ClusterDDPError(f"no running clusterddp job found under {clip(log_dir)}/",
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
    run_dir, data = find_launcher(options.target, options.log_dir)
    pid = int(data["pid"])
    if not _alive(pid):
        raise ClusterDDPError(f"the launcher of run {clip(str(data.get('run_id')))} (pid {pid}) is not running")
    before = stacks_reports(run_dir, pid)
    os.kill(pid, STACKS_REQUEST_SIGNAL)
    deadline = time.monotonic() + options.timeout
    while time.monotonic() < deadline:
        new = sorted(stacks_reports(run_dir, pid) - before)
        if new:
            time.sleep(0.1)  # the launcher writes the file in one go; let it finish
            with open(new[-1], encoding="utf-8") as f:
                print(f.read(), end="")
            print(f"(saved in {new[-1]})")
            return 0
        time.sleep(0.05)
    raise ClusterDDPError(f"no stacks from run {clip(str(data.get('run_id')))} within {options.timeout:g}s")
