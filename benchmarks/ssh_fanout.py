"""Start and finish a trivial 1-worker-per-host job on 4/16/32 SSH hosts: clusterddp vs pdsh.

pdsh runs the same worker with the env set by hand (RANK from the host name, WORLD_SIZE,
MASTER_ADDR...): no preflight, no supervision, no teardown; it is the floor. Hosts are network
namespaces with a real sshd each (tests/testbed), all sharing this machine's cores, so remote
start-up CPU (sshd, login shell, interpreters) grows with the host count for both tools.
"Head CPU" is user+system time of the head process and its children (pdsh: its ssh clients).

    sudo .venv/bin/python benchmarks/ssh_fanout.py [--sizes 4 16 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.testbed import lab_unavailable_reason, ssh_lab  # noqa: E402

WORKER = REPO / "tests" / "ssh" / "bin" / "noop.py"


def timed(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float, int, str]:
    """Wall seconds, head CPU seconds (process + children), exit code, last output lines."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode, (done.stdout + done.stderr)[-600:]


def bench(n: int, repeat: int) -> dict[str, tuple[float, float]]:
    results: dict[str, list[tuple[float, float]]] = {"clusterddp": [], "pdsh": []}
    with ssh_lab(n) as lab, tempfile.TemporaryDirectory(prefix="cdssh-bench-") as cwd:
        job = lab.root / "noop.yaml"
        job.write_text(f"name: noop\nscript: {WORKER}\nnproc_per_node: 1\n"
                       f"ssh:\n  config_file: {lab.ssh_config}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERDDP_")}
        clusterddp = [sys.executable, "-m", "clusterddp", "run", str(job), "--hostfile", str(lab.hostfile)]
        names = ",".join(h.name for h in lab.hosts)
        by_hand = (f"cd {cwd} && RANK=$(( $(hostname | tr -dc 0-9) - 1 )) LOCAL_RANK=0 WORLD_SIZE={n} "
                   f"LOCAL_WORLD_SIZE=1 MASTER_ADDR={lab.hosts[0].ip} MASTER_PORT=29500 "
                   f"{sys.executable} {WORKER}")
        pdsh = ["pdsh", "-R", "ssh", "-f", str(max(32, n)), "-w", names, by_hand]
        pdsh_env = {**env, "PDSH_SSH_ARGS": f"-F {lab.ssh_config} -x -a -l%u %h"}
        for _ in range(repeat):
            for tool, argv, tool_env in (("clusterddp", clusterddp, env), ("pdsh", pdsh, pdsh_env)):
                wall, cpu, code, tail = timed(argv, cwd, tool_env)
                if code != 0:
                    raise SystemExit(f"{tool} on {n} hosts failed ({code}):\n{tail}")
                results[tool].append((wall, cpu))
    return {tool: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
            for tool, runs in results.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    reason = lab_unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    if shutil.which("pdsh") is None:
        print("cannot run: pdsh is not installed (apt-get install pdsh)", file=sys.stderr)
        return 2
    print(f"median of {args.repeat} runs; worker: {WORKER.name}; {os.cpu_count()} CPUs shared by head and hosts")
    print(f"{'hosts':>5}  {'pdsh s':>7}  {'clusterddp s':>12}  {'ratio':>5}  "
          f"{'pdsh head CPU/host ms':>21}  {'clusterddp head CPU/host ms':>27}")
    for n in args.sizes:
        r = bench(n, args.repeat)
        (pw, pc), (cw, cc) = r["pdsh"], r["clusterddp"]
        print(f"{n:>5}  {pw:>7.2f}  {cw:>12.2f}  {cw / pw:>5.2f}  {1000 * pc / n:>21.0f}  {1000 * cc / n:>27.0f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
