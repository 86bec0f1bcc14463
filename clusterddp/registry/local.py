"""``status``, ``logs`` and ``stop`` of a run started here (local or the SSH head), by run id.

``stop`` signals the recorded launcher (or head), and only when ``procid`` proves the pid is
still that process: a pid alone may name a stranger by the time the user types ``stop``.
The launcher then stops every rank (the head: every host) as on Ctrl-C, and records its end.
"""

from __future__ import annotations

import signal
import time
from typing import Mapping

from clusterddp.procid import NotTheProcess, signal_process, why_not_running
from clusterddp.registry import store
from clusterddp.registry.logs import rank_logs, show
from clusterddp.registry.store import FINAL, RunRecord
from clusterddp.registry.view import live, zombie

#: Seconds ``stop`` waits for the launcher to end beyond the run's own teardown.
STOP_WAIT = 120.0


def running(record: RunRecord) -> bool:
    identity = record.identity()
    return identity is not None and why_not_running(identity) is None and not zombie(identity.pid)


def stop(record: RunRecord, env: Mapping[str, str] | None = None, wait: float = STOP_WAIT) -> int:
    """SIGTERM to the proved launcher, then wait for it to end; 0 when the run is over."""
    row = live(record)
    if row.state in FINAL:
        print(f"clusterddp: run {record.run_id} has already ended ({row.state}"
              + (f", exit code {record.exit_code}" if record.exit_code is not None else "") + "): nothing to stop")
        return 0
    identity = record.identity()
    if identity is None:
        print(f"clusterddp: run {record.run_id}: the record names no launcher: nothing to stop")
        return 0
    store.update(record.run_id, env, stop_requested=store.now())
    try:
        signal_process(identity, signal.SIGTERM)
    except NotTheProcess as exc:
        print(f"clusterddp: run {record.run_id} is not running ({exc}): nothing to stop")
        return 0
    print(f"clusterddp: asked run {record.run_id} to stop (SIGTERM to its launcher, pid {identity.pid})")
    deadline = time.monotonic() + wait
    while why_not_running(identity) is None and not zombie(identity.pid):
        if time.monotonic() > deadline:
            print(f"clusterddp: run {record.run_id}: its launcher is still stopping after {wait:.0f}s")
            return 1
        time.sleep(0.1)
    print(f"clusterddp: run {record.run_id} stopped")
    return 0


def logs(record: RunRecord, follow: bool, rank: int | None) -> int:
    sources = rank_logs(record.run_dir, rank)
    refresh = (lambda: rank_logs(record.run_dir)) if rank is None else None
    return show(sources, follow, lambda: running(record), refresh)
