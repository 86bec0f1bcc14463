"""``clusterddp stacks``: ask a running launcher for every worker's stack, print the answer.

The launcher of a run writes ``logs/<run-id>/launcher.json`` (its pid); we send it
``STACKS_REQUEST_SIGNAL``, it signals its workers (an SSH head also asks every remote
launcher), groups the stacks, and writes ``stacks-*.txt`` beside the logs. The job goes on.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from dataclasses import dataclass

from clusterddp.errors import ClusterDDPError


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def find_launcher(target: str | None, log_dir: str) -> tuple[str, dict]:
    """The run directory and launcher.json of ``target`` (run id or dir), or the newest live run."""
    if target:
        candidates = [target, os.path.join(log_dir, target)]
        for directory in candidates:
            path = os.path.join(directory, "launcher.json")
            if os.path.isfile(path):
                with open(path) as f:
                    return directory, json.load(f)
        raise ClusterDDPError(f"no running job found at {' or '.join(candidates)} (no launcher.json)")
    runs = sorted(glob.glob(os.path.join(log_dir, "*", "launcher.json")), key=os.path.getmtime, reverse=True)
    for path in runs:
        with open(path) as f:
            data = json.load(f)
        if _alive(int(data.get("pid", 0))):
            return os.path.dirname(path), data
    raise ClusterDDPError(f"no running clusterddp job found under {log_dir}/",
                          "give the run id or its log directory: clusterddp stacks RUN_ID")


def _reports(run_dir: str, pid: int) -> set[str]:
    """Reports written by the launcher ``pid``: ``stacks-<date>-<time>-<pid>[.N].txt``.

    Only that launcher's: on a shared filesystem the hosts of an SSH run dump into the same
    directory, and their per-host files must not be mistaken for the head's merged report.
    """
    pattern = re.compile(rf"^stacks-\d{{8}}-\d{{6}}-{pid}(\.\d+)*\.txt$")
    return {path for path in glob.glob(os.path.join(run_dir, "stacks-*.txt"))
            if pattern.match(os.path.basename(path))}


@dataclass(frozen=True)
class StacksOptions:
    """Which run to ask, and how long to wait for its answer."""

    #: Run id or log directory; None: the newest run under ``log_dir`` whose launcher is alive.
    target: str | None = None
    log_dir: str = "logs"
    timeout: float = 10.0


def stacks_main(options: StacksOptions) -> int:
    """Ask the run's launcher for every worker's stack; print the grouped report."""
    from clusterddp.launch.supervisor import STACKS_REQUEST_SIGNAL

    run_dir, data = find_launcher(options.target, options.log_dir)
    pid = int(data["pid"])
    if not _alive(pid):
        raise ClusterDDPError(f"the launcher of run {data.get('run_id')} (pid {pid}) is not running")
    before = _reports(run_dir, pid)
    os.kill(pid, STACKS_REQUEST_SIGNAL)
    deadline = time.monotonic() + options.timeout
    while time.monotonic() < deadline:
        new = sorted(_reports(run_dir, pid) - before)
        if new:
            time.sleep(0.1)  # the launcher writes the file in one go; let it finish
            with open(new[-1], encoding="utf-8") as f:
                print(f.read(), end="")
            print(f"(saved in {new[-1]})")
            return 0
        time.sleep(0.05)
    raise ClusterDDPError(f"no stacks from run {data.get('run_id')} within {options.timeout:g}s")
