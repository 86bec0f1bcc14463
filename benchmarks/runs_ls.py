"""``clusterddp ls`` over 1,000 recorded runs (issue 33, goal 3: answer in <= 1 s).

Writes N records into a fresh registry (``CLUSTERDDP_HOME`` in a temporary directory): most
finished or failed (with a root cause and goodput recorded), a few still running whose
launcher is this benchmark's own process (so ``ls`` checks each with procid and reads its run
directory's events), a few lost (a pid no longer theirs). Then times the whole command,
``python -m clusterddp ls`` (and ``--json``) as a user types it, start-up included, the median
of R rounds. No platform is asked (no SLURM record is pending).

    .venv/bin/python benchmarks/runs_ls.py [--runs 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clusterddp.procid import this_process
from clusterddp.registry import store


def populate(home: Path, count: int) -> None:
    env = {"CLUSTERDDP_HOME": str(home)}
    me = this_process()
    now = time.time()
    for i in range(count):
        run_dir = home / "logs" / f"run-{i:05d}"
        kind = i % 50
        record = store.RunRecord(run_id=f"bench-{i:05d}", target="local" if i % 3 else "ssh", job="bench",
                                 run_dir=str(run_dir), hosts=["vm"] if i % 3 else ["n1", "n2", "n3"],
                                 started=now - 3600 * 24 * 7 + i * 60, ended=now - 3600 * 24 * 7 + i * 60 + 55,
                                 state="finished", exit_code=0, attempts=1 + (i % 4 == 0), goodput=0.8,
                                 launcher={**me.as_record(), "host": me.host})
        if kind == 1:
            record.state, record.exit_code, record.root_cause = "failed", 1, "rank 3 on n2 exit code 1: ValueError"
        elif kind in (2, 3):  # running: its launcher is this process; its events are read
            record.state, record.ended, record.exit_code, record.goodput = "running", None, None, None
            run_dir.mkdir(parents=True)
            events = [{"t": now - 50, "kind": "run_start", "node": None, "host": "vm", "attempt": 0},
                      {"t": now - 49, "kind": "attempt_start", "node": None, "host": "vm", "attempt": 0},
                      {"t": now - 45, "kind": "first_step", "node": None, "host": "vm", "attempt": 0}]
            (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        elif kind == 4:  # lost: the pid is not its launcher any more
            record.state, record.ended, record.exit_code = "running", None, None
            record.launcher = {**record.launcher, "start_time": 1} if record.launcher else None
        store.save(record, env)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, len(done.stdout.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        populate(home, args.runs)
        env = {**os.environ, "CLUSTERDDP_HOME": str(home)}
        base = [sys.executable, "-m", "clusterddp"]
        rows = {"ls": base + ["ls"], "ls --json": base + ["ls", "--json"], "--version (start-up alone)": base + ["--version"]}
        for name, argv in rows.items():
            times, lines = [], 0
            for _ in range(args.rounds):
                seconds, lines = timed(argv, env)
                times.append(seconds)
            print(f"{name:28s} {args.runs} records: median {statistics.median(times):.3f}s "
                  f"(min {min(times):.3f}s, max {max(times):.3f}s, {args.rounds} rounds, {lines} lines)")


if __name__ == "__main__":
    main()
