"""Launch overhead, side by side in one run: clusterddp vs torchrun vs a bare shell spawn.

Each method starts N workers of benchmarks/noop_gloo.py (join gloo, barrier, leave) on this
machine; clusterddp's job says ``backend: gloo``, so a GPU node runs the same CPU job (with
``backend: auto`` it would be nccl there, and 2 workers on 1 GPU are refused). The bare shell spawn (export the env contract by hand, '&', 'wait') is the floor: no
launcher can do less. Methods are interleaved round by round so a busy moment hurts all alike.
Also reports the launcher's peak RSS (its own process, sampled every 5 ms).

torch's own rendezvous adds a random 0-0.7 s to any run (a rank that connects before rank 0's
store listens retries with a back-off), under every launcher alike; so the ratio is given on
the median and on the best run. The worker also records when it started and ended, which
splits off exactly what the launcher adds: "start" is launch -> first worker running, "exit"
is last worker done -> launcher gone.

"ready" is launch -> the last worker past its ``import torch`` (its first line after the
imports). "clusterddp" forks its workers from a warm interpreter (docs/warm-start.md);
"clusterddp cold" is the same with ``warm_start: false``; ``--before CHECKOUT`` adds another
checkout's clusterddp (its default settings, by PYTHONPATH) to the same rounds.

The cold-start table (issue 25, goal 2: ready within 1.2x one ``import torch``) sets "ready"
beside the reference, one plain ``python noop_gloo.py --ready-only``: launch -> its first
line after ``import torch.distributed``, measured the same way, in every round. That is the
strict reading of "one import torch": interpreter start and the import, what a worker of any
launcher must wait for, and nothing after it. Also printed, not used for the ratio: the
import alone (no interpreter start, ~20 ms less) and the whole ``python -c 'import torch'``
process (its finalization adds ~0.4 s here, which no worker waits for).

    flock /tmp/cddp-bench.lock .venv/bin/python benchmarks/launch_overhead.py \
        [--rounds 5] [--sizes 2 4 8] [--before /work/main] [--cold-start-only]

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
from typing import Callable

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


def bench_job(name: str, extra: str = "") -> str:
    """A job file for the worker with ``backend: gloo``: the worker joins gloo whatever the node
    has, and ``backend: auto`` would be nccl on a GPU node, where clusterddp rightly refuses
    more nccl workers than GPUs (2 workers, 1 GPU). Every launcher here then runs the same CPU
    job, GPUs or not."""
    job = os.path.join(tempfile.gettempdir(), f"clusterddp-bench-{name}.yaml")
    with open(job, "w") as f:
        f.write(f"name: {name}\nscript: {WORKER}\nargs: ['{STAMPS}']\nbackend: gloo\n{extra}")
    return job


def clusterddp(n: int, port: int) -> list[str]:
    return [sys.executable, "-m", "clusterddp", "run", bench_job("warm"), "--nproc-per-node", str(n),
            "--master-port", str(port), "--log-dir", os.path.join(tempfile.gettempdir(), "clusterddp-bench-logs")]


def clusterddp_cold(n: int, port: int) -> list[str]:
    return [sys.executable, "-m", "clusterddp", "run", bench_job("cold", "warm_start: false\n"), "--nproc-per-node",
            str(n), "--master-port", str(port), "--log-dir", os.path.join(tempfile.gettempdir(), "clusterddp-bench-logs")]


def reference(n: int, port: int) -> list[str]:
    """One plain interpreter that imports torch and stops at its first line (``n``, ``port``: unused)."""
    return [sys.executable, str(WORKER), STAMPS, "--ready-only"]


METHODS = {"floor (sh)": bare_shell, "torchrun": torchrun, "clusterddp": clusterddp, "clusterddp cold": clusterddp_cold}
#: Run in each round beside the methods (not in the launcher table): the cold-start reference.
REFERENCE = "python (1 process)"
#: Methods that run with another checkout's clusterddp first on PYTHONPATH (``--before``).
BEFORE = "clusterddp before"
IMPORT_TORCH = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"


def import_torch() -> tuple[float, float]:
    """One ``import torch`` in a fresh interpreter: (the import alone, the whole process)."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", IMPORT_TORCH], capture_output=True, text=True, check=True).stdout
    return float(out), time.perf_counter() - start


def timed(argv: list[str], checkout: str | None = None) -> tuple[float, int, float, float, float]:
    """Wall time, peak RSS of the top process (the launcher), the launcher's start and exit
    overheads from the workers' own time stamps, and launch -> the last worker ready.
    ``checkout``: another clusterddp checkout, first on PYTHONPATH."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if checkout:
        env["PYTHONPATH"] = checkout
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
    parser.add_argument("--before", help="another checkout's clusterddp, run beside (e.g. /work/main)")
    parser.add_argument("--cold-start-only", action="store_true",
                        help="only what the cold-start table needs (no floor, no launcher table)")
    args = parser.parse_args()
    methods: dict[str, tuple[Callable[[int, int], list[str]], str | None]] = {
        name: (build, None) for name, build in METHODS.items()
        if not (args.cold_start_only and name == "floor (sh)")}
    if args.before:
        methods[BEFORE] = (clusterddp, os.path.abspath(args.before))
    methods[REFERENCE] = (reference, None)
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
            for name, (build, checkout) in methods.items():
                elapsed, peak, start_gap, exit_gap, ready_gap = timed(build(n, port), checkout)
                ready.setdefault((name, n), []).append(ready_gap)
                port += 1
                results.setdefault((name, n), []).append(elapsed)
                starts.setdefault((name, n), []).append(start_gap)
                exits.setdefault((name, n), []).append(exit_gap)
                rss[(name, n)] = max(rss.get((name, n), 0), peak)
    load = os.getloadavg()
    cold_start_table(args.sizes, ready, imports, import_procs, args.before, load)
    if args.cold_start_only:
        return
    torch_import = statistics.median(imports)
    print()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; import torch: {torch_import:.3f} s "
          f"(median of {len(imports)}; the whole 'python -c \"import torch\"' process: "
          f"{statistics.median(import_procs):.3f} s)")
    print(f"{'workers':>7}  {'method':<17} {'median s':>9} {'min s':>7} {'x floor (median)':>17} "
          f"{'x floor (min)':>14} {'start ms':>9} {'exit ms':>8} {'ready s':>8} {'ready/import':>13} "
          f"{'launcher peak RSS':>18}")
    for n in args.sizes:
        floor = results[("floor (sh)", n)]
        for name in methods:
            if name == REFERENCE:
                continue
            times = results[(name, n)]
            median = statistics.median(times)
            ready_median = statistics.median(ready[(name, n)])
            print(f"{n:>7}  {name:<17} {median:>9.3f} {min(times):>7.3f} {median / statistics.median(floor):>17.3f} "
                  f"{min(times) / min(floor):>14.3f} {statistics.median(starts[(name, n)]) * 1000:>9.0f} "
                  f"{statistics.median(exits[(name, n)]) * 1000:>8.0f} {ready_median:>8.3f} "
                  f"{ready_median / torch_import:>13.2f} {rss[(name, n)] / 2**20:>15.1f} MB")


def cold_start_table(sizes: list[int], ready: dict[tuple[str, int], list[float]], imports: list[float],
                     import_procs: list[float], before: str | None, load: tuple[float, float, float]) -> None:
    """Launch -> the last worker ready, per launcher, beside the reference (issue 25, goal 2)."""
    rounds = len(ready[(REFERENCE, sizes[0])])
    print(f"cold start: launch -> the last worker's first line after import torch, median of {rounds} interleaved "
          f"rounds; x ref: / one python process to the same line (target <= 1.2)")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs; "
          f"the import alone {statistics.median(imports):.3f} s, the whole 'python -c \"import torch\"' "
          f"{statistics.median(import_procs):.3f} s (medians)")
    names = ["clusterddp", "clusterddp cold", "torchrun"] + ([BEFORE] if before else [])
    shown = {"clusterddp": "clusterddp", "clusterddp cold": "warm_start: false", "torchrun": "torchrun",
             BEFORE: "clusterddp before"}
    print(f"{'workers':>7}  {'ref s':>6}" + "".join(f"  {shown[name]:>17} {'x ref':>5}" for name in names))
    for n in sizes:
        ref = statistics.median(ready[(REFERENCE, n)])
        cells = "".join(f"  {statistics.median(ready[(name, n)]):>17.3f} {statistics.median(ready[(name, n)]) / ref:>5.2f}"
                        for name in names)
        print(f"{n:>7}  {ref:>6.3f}{cells}")


if __name__ == "__main__":
    main()
