"""Launch overhead, side by side in one run: clusterddp vs torchrun vs a bare shell spawn.

Each method starts N workers of benchmarks/noop_gloo.py (join gloo, barrier, leave) on this
machine. The bare shell spawn (export the env contract by hand, '&', 'wait') is the floor: no
launcher can do less. Methods are interleaved round by round so a busy moment hurts all alike.
Also reports the launcher's peak RSS (its own process, sampled every 5 ms).

    .venv/bin/python benchmarks/launch_overhead.py [--rounds 5] [--sizes 2 4]

Targets (issue 2): clusterddp <= 1.10x the floor; launcher RSS <= 60 MB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
WORKER = HERE / "noop_gloo.py"
PORT = 29700


def bare_shell(n: int, port: int) -> list[str]:
    lines = []
    for rank in range(n):
        lines.append(f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE={n} LOCAL_WORLD_SIZE={n} MASTER_ADDR=127.0.0.1 "
                     f"MASTER_PORT={port} {sys.executable} {WORKER} &")
    lines.append("wait")
    return ["sh", "-c", "\n".join(lines)]


def torchrun(n: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}", "--master-addr=127.0.0.1",
            f"--master-port={port}", str(WORKER)]


def clusterddp(n: int, port: int) -> list[str]:
    return [sys.executable, "-m", "clusterddp", "run", "--nproc-per-node", str(n), "--master-port", str(port),
            "--log-dir", "/tmp/clusterddp-bench-logs", "--", str(WORKER)]


METHODS = {"floor (sh)": bare_shell, "torchrun": torchrun, "clusterddp": clusterddp}


def timed(argv: list[str]) -> tuple[float, int]:
    """Wall time of one run and the peak RSS of the top process (the launcher)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]

    def sample() -> None:
        try:
            me = psutil.Process(proc.pid)
            while proc.poll() is None:
                peak[0] = max(peak[0], me.memory_info().rss)
                time.sleep(0.005)
        except psutil.Error:
            pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    elapsed = time.perf_counter() - start
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return elapsed, peak[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    results: dict[tuple[str, int], list[float]] = {}
    rss: dict[tuple[str, int], int] = {}
    port = PORT
    for n in args.sizes:
        timed(bare_shell(n, port))  # warm the page cache once
        port += 1
        for _ in range(args.rounds):
            for name, build in METHODS.items():
                elapsed, peak = timed(build(n, port))
                port += 1
                results.setdefault((name, n), []).append(elapsed)
                rss[(name, n)] = max(rss.get((name, n), 0), peak)
    print(f"{'workers':>7}  {'method':<12} {'median s':>9} {'min s':>7} {'x floor':>8} {'launcher peak RSS':>18}")
    for n in args.sizes:
        floor = statistics.median(results[("floor (sh)", n)])
        for name in METHODS:
            times = results[(name, n)]
            median = statistics.median(times)
            print(f"{n:>7}  {name:<12} {median:>9.3f} {min(times):>7.3f} {median / floor:>8.3f} "
                  f"{rss[(name, n)] / 2**20:>15.1f} MB")


if __name__ == "__main__":
    main()
