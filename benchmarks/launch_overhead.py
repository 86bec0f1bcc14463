"""Launch overhead, side by side in one run: clusterddp vs torchrun vs a bare shell spawn.

Each method starts N workers of benchmarks/noop_gloo.py (join gloo, barrier, leave) on this
machine. The bare shell spawn (export the env contract by hand, '&', 'wait') is the floor: no
launcher can do less. Methods are interleaved round by round so a busy moment hurts all alike.
Also reports the launcher's peak RSS (its own process, sampled every 5 ms).

torch's own rendezvous adds a random 0-0.7 s to any run (a rank that connects before rank 0's
store listens retries with a back-off), under every launcher alike; so the ratio is given on
the median and on the best run. The worker also records when it started and ended, which
splits off exactly what the launcher adds: "start" is launch -> first worker running, "exit"
is last worker done -> launcher gone.

"ready" is launch -> the last worker past its ``import torch`` (its first line after the
imports); it is set beside one ``import torch`` timed in a fresh interpreter in the same round
("import torch" row: the import alone, and the whole ``python -c 'import torch'`` process).
"clusterddp" forks its workers from a warm interpreter (docs/warm-start.md); "clusterddp
cold" is the same with ``warm_start: false``.

    .venv/bin/python benchmarks/launch_overhead.py [--rounds 5] [--sizes 2 4 8]

Targets: clusterddp <= 1.10x the floor; launcher RSS <= 60 MB (issue 2); the workers ready
within 1.2x one ``import torch`` for 2, 4 and 8 workers (issue 25).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
WORKER = HERE / "noop_gloo.py"
PORT = 29700


STAMPS = os.path.join(tempfile.gettempdir(), "clusterddp-bench-stamps")


def bare_shell(n: int, port: int) -> list[str]:
    lines = []
    for rank in range(n):
        lines.append(f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE={n} LOCAL_WORLD_SIZE={n} MASTER_ADDR=127.0.0.1 "
                     f"MASTER_PORT={port} {sys.executable} {WORKER} {STAMPS} &")
    lines.append("wait")
    return ["sh", "-c", "\n".join(lines)]


def torchrun(n: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}", "--master-addr=127.0.0.1",
            f"--master-port={port}", str(WORKER), STAMPS]


def clusterddp(n: int, port: int) -> list[str]:
    return [sys.executable, "-m", "clusterddp", "run", "--nproc-per-node", str(n), "--master-port", str(port),
            "--log-dir", os.path.join(tempfile.gettempdir(), "clusterddp-bench-logs"), "--", str(WORKER), STAMPS]


def clusterddp_cold(n: int, port: int) -> list[str]:
    job = os.path.join(tempfile.gettempdir(), "clusterddp-bench-cold.yaml")
    with open(job, "w") as f:
        f.write(f"name: cold\nscript: {WORKER}\nargs: ['{STAMPS}']\nwarm_start: false\n")
    return [sys.executable, "-m", "clusterddp", "run", job, "--nproc-per-node", str(n), "--master-port", str(port),
            "--log-dir", os.path.join(tempfile.gettempdir(), "clusterddp-bench-logs")]


METHODS = {"floor (sh)": bare_shell, "torchrun": torchrun, "clusterddp": clusterddp, "clusterddp cold": clusterddp_cold}
IMPORT_TORCH = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"


def import_torch() -> tuple[float, float]:
    """One ``import torch`` in a fresh interpreter: (the import alone, the whole process)."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", IMPORT_TORCH], capture_output=True, text=True, check=True).stdout
    return float(out), time.perf_counter() - start


def timed(argv: list[str]) -> tuple[float, int, float, float, float]:
    """Wall time, peak RSS of the top process (the launcher), and the launcher's start and
    exit overheads from the workers' own time stamps."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if os.path.exists(STAMPS):
        os.unlink(STAMPS)
    launched = time.time()
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
    ended = time.time()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    with open(STAMPS) as f:
        stamps = [tuple(map(float, line.split())) for line in f if line.strip()]
    first_start = min(s for s, _r, _e in stamps)
    last_ready = max(r for _s, r, _e in stamps)
    last_end = max(e for _s, _r, e in stamps)
    return elapsed, peak[0], first_start - launched, ended - last_end, last_ready - launched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    results: dict[tuple[str, int], list[float]] = {}
    rss: dict[tuple[str, int], int] = {}
    starts: dict[tuple[str, int], list[float]] = {}
    exits: dict[tuple[str, int], list[float]] = {}
    ready: dict[tuple[str, int], list[float]] = {}
    imports: list[float] = []
    import_procs: list[float] = []
    port = PORT
    for n in args.sizes:
        timed(bare_shell(n, port))  # warm the page cache once
        port += 1
        for _ in range(args.rounds):
            alone, whole = import_torch()
            imports.append(alone)
            import_procs.append(whole)
            for name, build in METHODS.items():
                elapsed, peak, start_gap, exit_gap, ready_gap = timed(build(n, port))
                ready.setdefault((name, n), []).append(ready_gap)
                port += 1
                results.setdefault((name, n), []).append(elapsed)
                starts.setdefault((name, n), []).append(start_gap)
                exits.setdefault((name, n), []).append(exit_gap)
                rss[(name, n)] = max(rss.get((name, n), 0), peak)
    torch_import = statistics.median(imports)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; import torch: {torch_import:.3f} s "
          f"(median of {len(imports)}; the whole 'python -c \"import torch\"' process: "
          f"{statistics.median(import_procs):.3f} s)")
    print(f"{'workers':>7}  {'method':<15} {'median s':>9} {'min s':>7} {'x floor (median)':>17} "
          f"{'x floor (min)':>14} {'start ms':>9} {'exit ms':>8} {'ready s':>8} {'ready/import':>13} "
          f"{'launcher peak RSS':>18}")
    for n in args.sizes:
        floor = results[("floor (sh)", n)]
        for name in METHODS:
            times = results[(name, n)]
            median = statistics.median(times)
            ready_median = statistics.median(ready[(name, n)])
            print(f"{n:>7}  {name:<15} {median:>9.3f} {min(times):>7.3f} {median / statistics.median(floor):>17.3f} "
                  f"{min(times) / min(floor):>14.3f} {statistics.median(starts[(name, n)]) * 1000:>9.0f} "
                  f"{statistics.median(exits[(name, n)]) * 1000:>8.0f} {ready_median:>8.3f} "
                  f"{ready_median / torch_import:>13.2f} {rss[(name, n)] / 2**20:>15.1f} MB")


if __name__ == "__main__":
    main()
