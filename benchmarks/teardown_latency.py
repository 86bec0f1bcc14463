"""Teardown latency, side by side: from a worker's failure to the launcher's exit.

Rank 1 of N exits 3 after a short delay (recording the wall time just before it exits);
the other ranks sleep as if blocked in a collective and respond to SIGTERM by dying. The
latency is the launcher's exit time minus that timestamp: how long a dead rank leaves the
others running. clusterddp and torchrun run the same worker, interleaved round by round.

    .venv/bin/python benchmarks/teardown_latency.py [--rounds 5] [--nproc 4]

Target (issue 2): clusterddp <= 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "fail_after.py"


def launchers(nproc: int, stamp: str, port: int) -> dict[str, list[str]]:
    worker = [str(WORKER), "1.0", stamp]
    return {
        "clusterddp": [sys.executable, "-m", "clusterddp", "run", "--nproc-per-node", str(nproc),
                       "--log-dir", os.path.join(tempfile.gettempdir(), "clusterddp-bench-logs"), "--", *worker],
        "torchrun": [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                     f"--master-port={port}", *worker],
    }


def latency(argv: list[str], stamp: str) -> float:
    if os.path.exists(stamp):
        os.unlink(stamp)
    proc = subprocess.run(argv, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, timeout=120)
    ended = time.time()
    if proc.returncode == 0:
        raise SystemExit(f"{argv[2]} should have failed")
    with open(stamp) as f:
        return ended - float(f.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args()
    stamp = os.path.join(tempfile.mkdtemp(prefix="teardown-"), "failed_at")
    results: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for name, argv in launchers(args.nproc, stamp, 29800 + r).items():
            results.setdefault(name, []).append(latency(argv, stamp))
    print(f"{args.nproc} workers, rank 1 exits 3, the others wait; {args.rounds} rounds")
    print(f"{'launcher':<11} {'median s':>9} {'max s':>7}")
    for name, values in results.items():
        print(f"{name:<11} {statistics.median(values):>9.3f} {max(values):>7.3f}")


if __name__ == "__main__":
    main()
