"""Restart latency on one node, side by side: from a SIGKILL of a worker to the first completed
step of the next attempt.

Two gloo workers run benchmarks/kill_at_step.py; at step 20 of attempt 0 rank 1 records the
wall time and SIGKILLs itself (`restarts: 1`, every other setting the job's default); rank 0
of attempt 1 records when its first all_reduce completed. clusterddp (warm start, the
default for a script that imports torch), clusterddp with `warm_start: false`, torchrun
`--max-restarts 1` (c10d rendezvous, its store not shared with the workers: see methods), and optionally another checkout's clusterddp (``--before /work/main``),
on the same script, interleaved round by round so a busy moment hurts all alike.

    .venv/bin/python benchmarks/restart_latency.py [--rounds 5] [--before /work/main]

``--slurm``: the same on the SLURM test bed instead (tests/testbed/slurm_cluster.py: root,
slurmctld/slurmd in network namespaces; hold /tmp/cddp-testbed.lock): 2 nodes x 1 worker,
`restarts: 1`, default settings, submitted with `clusterddp submit slurm`; the kill to the
next attempt's first step, this checkout and ``--before``'s, interleaved round by round.

Target (issue 25): clusterddp's median <= 1.5 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "kill_at_step.py"


def job_file(directory: str, out: str, warm: bool) -> str:
    path = os.path.join(directory, f"job-{'warm' if warm else 'cold'}.yaml")
    with open(path, "w") as f:
        f.write(f"name: restart-latency\nscript: {WORKER}\nargs: ['{out}', '20']\nnproc_per_node: 2\n"
                f"restarts: 1\nlogs: {{dir: '{directory}/logs'}}\n" + ("" if warm else "warm_start: false\n"))
    return path


def methods(directory: str, out: str, port: int, before: str | None) -> dict[str, tuple[list[str], str | None]]:
    """name -> (argv, the checkout it runs from, None: this one)."""
    found = {
        "clusterddp": ([sys.executable, "-m", "clusterddp", "run", job_file(directory, out, True),
                        "--master-port", str(port)], None),
        "clusterddp cold": ([sys.executable, "-m", "clusterddp", "run", job_file(directory, out, False),
                             "--master-port", str(port + 1)], None),
        # torchrun's default static rendezvous (--master-port), and c10d sharing its store with
        # the workers, let attempt 1's rank 0 read attempt 0's dead rank 1 address from the
        # agent's store and time out (torch 2.14.1, most runs here): c10d, store not shared.
        "torchrun": ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=1",
                      "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port + 2}", str(WORKER), out, "20"], None),
    }
    if before:
        found["clusterddp before"] = ([sys.executable, "-m", "clusterddp", "run", job_file(directory, out, True),
                                      "--master-port", str(port + 3)], before)
    return found


def latency(argv: list[str], out: str, checkout: str | None) -> float | str:
    """Seconds from the kill to the next attempt's first step, or why the run failed."""
    for name in ("killed", "resumed"):
        if os.path.exists(os.path.join(out, name)):
            os.unlink(os.path.join(out, name))
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    if checkout:
        env["PYTHONPATH"] = checkout
    proc = subprocess.Popen(argv, env=env, cwd=checkout or os.getcwd(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # a launcher that hangs: its workers go with it (torchrun leaves them)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timed out after 300 s"
    if proc.returncode != 0:
        errors = [line for line in stderr.decode(errors="replace").splitlines() if "Error" in line]
        return f"exit {proc.returncode}: {(errors or ['?'])[-1][:160]}"
    with open(os.path.join(out, "killed")) as k, open(os.path.join(out, "resumed")) as r:
        return float(r.read()) - float(k.read())


def slurm_latency(cluster: object, directory: str, name: str, checkout: str | None) -> float | str:
    """One job on the SLURM bed: seconds from the kill to the next attempt's first step, or why not."""
    from tests.testbed.slurm_cluster import SlurmCluster

    assert isinstance(cluster, SlurmCluster)
    out = os.path.join(directory, name)
    os.makedirs(out)
    # Another checkout renders its own script (its templates are not on PYTHONPATH): its venv's python.
    python = os.path.join(checkout, ".venv", "bin", "python") if checkout else sys.executable
    job = os.path.join(directory, f"{name}.yaml")
    with open(job, "w") as f:
        f.write(f"name: {name}\nscript: {WORKER}\nargs: ['{out}', '20']\nnodes: 2\nnproc_per_node: 1\n"
                f"restarts: 1\npython: {python}\n"
                "env: {GLOO_SOCKET_IFNAME: eth0, OMP_NUM_THREADS: '1'}\n")
    submitted = subprocess.run([python, "-m", "clusterddp", "submit", "slurm", job], cwd=directory, env=cluster.env,
                               capture_output=True, text=True, timeout=60)
    if submitted.returncode != 0:
        return f"submit failed: {submitted.stderr.strip()[-160:]}"
    job_id = submitted.stdout.strip()
    started = time.monotonic()
    state = cluster.wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), timeout=300)
    print(f"{name}: job {job_id} {state['JobState']} after {time.monotonic() - started:.1f}s", file=sys.stderr)
    cluster.wait_clean(15)
    if state["JobState"] != "COMPLETED":
        return f"job {job_id} {state['JobState']}"
    with open(os.path.join(out, "killed")) as k, open(os.path.join(out, "resumed")) as r:
        return float(r.read()) - float(k.read())


def slurm_main(rounds: int, before: str | None) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """``rounds`` jobs per checkout on a 2-node bed, interleaved."""
    sys.path.insert(0, str(HERE.parent))
    from tests.testbed.slurm_cluster import slurm_cluster

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERDDP_", "PYTHONPATH"))}
    results: dict[str, list[float]] = {}
    failures: dict[str, list[str]] = {}
    directory = tempfile.mkdtemp(prefix="restart-latency-slurm-")
    checkouts = {"clusterddp": None, **({"clusterddp before": before} if before else {})}
    with slurm_cluster(2, base_env=dict(env, OMP_NUM_THREADS="1", NO_COLOR="1")) as cluster:
        for r in range(rounds):
            for name, checkout in checkouts.items():
                value = slurm_latency(cluster, directory, f"{name.replace(' ', '-')}-{r}", checkout)
                if isinstance(value, str):
                    failures.setdefault(name, []).append(value)
                else:
                    results.setdefault(name, []).append(value)
    return results, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", help="another checkout's clusterddp, run beside (e.g. /work/main)")
    parser.add_argument("--slurm", action="store_true", help="the SLURM test bed case (root; 2 nodes x 1 worker)")
    args = parser.parse_args()
    if args.slurm:
        results, failures = slurm_main(args.rounds, args.before)
        print(f"SLURM test bed, 2 nodes x 1 gloo worker, rank 1 SIGKILLed at step 20, restarts 1; "
              f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        table(results, failures)
        return
    directory = tempfile.mkdtemp(prefix="restart-latency-")
    out = os.path.join(directory, "stamps")
    os.makedirs(out)
    results: dict[str, list[float]] = {}
    failures: dict[str, list[str]] = {}
    for r in range(args.rounds):
        for name, (argv, checkout) in methods(directory, out, 29900 + 10 * r, args.before).items():
            value = latency(argv, out, checkout)
            if isinstance(value, str):
                failures.setdefault(name, []).append(value)
            else:
                results.setdefault(name, []).append(value)
    print(f"2 gloo workers, rank 1 SIGKILLed at step 20, restarts 1; {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    table(results, failures)


def table(results: dict[str, list[float]], failures: dict[str, list[str]]) -> None:
    print(f"{'launcher':<18} {'median s':>9} {'min s':>7} {'max s':>7}  all")
    for name, values in results.items():
        print(f"{name:<18} {statistics.median(values):>9.2f} {min(values):>7.2f} {max(values):>7.2f}  "
              + " ".join(f"{v:.2f}" for v in values))
    for name, reasons in failures.items():
        print(f"{name}: {len(reasons)} run(s) failed, not counted; last: {reasons[-1]}")


if __name__ == "__main__":
    main()
