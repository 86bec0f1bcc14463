"""Restart latency in a runc container, side by side with bare: from a SIGKILL of a worker to
the first completed step of the next attempt, as benchmarks/restart_latency.py measures it.

The job is restart_latency.py's: two gloo workers run benchmarks/kill_at_step.py; at step 20
of attempt 0 rank 1 records the wall time and SIGKILLs itself (`restarts: 1`); rank 0 of
attempt 1 records when its first all_reduce completed. Rows, interleaved round by round so a
busy moment hurts all alike:

- ``bare``: ``python -m clusterddp run`` on this machine (warm start, the default);
- ``bare, warm_start: false``;
- ``runc``: the same job in a runc container, as a SLURM node's container runs it: the
  image's ``/usr/bin/python3`` runs the zipapp (``clusterddp pack``, this checkout) as the
  container's PID 1 (``python3 clusterddp.pyz run JOB``), warm start the default;
- ``runc, warm_start: false``;
- with ``--before CHECKOUT``: ``runc before``, the zipapp packed from that checkout (one
  whose zipapp cannot start its warm interpreter: every attempt cold).

The image is the OCI test bed's (tests/testbed/containers.py, docs/containers.md): Debian
bookworm's python3 by ``mmdebstrap`` (the Debian mirror, about 30 s), this run's torch bound
read-only, no clusterddp or PyYAML in it. ``--rootfs TAR`` keeps mmdebstrap's tar there and
reuses it when it exists (nothing is downloaded then). The container keeps the host's network
namespace (gloo on 127.0.0.1), has its own PID and mount namespaces, a read-only root and a
tmpfs /tmp. Needs root, runc and mmdebstrap:

    .venv/bin/python benchmarks/container_restart.py [--rounds 5] [--rootfs /var/tmp/rootfs.tar] [--before /work/main]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.testbed import containers  # noqa: E402

WORKER = HERE / "kill_at_step.py"
TIMEOUT = 300


def job_file(work: Path, name: str, warm: bool) -> Path:
    """The restart_latency.py job, its script and output in ``work`` (the container sees it)."""
    path = work / f"{name}.yaml"
    path.write_text(f"name: {name}\nscript: {work / WORKER.name}\nargs: ['{work / 'out'}', '20']\n"
                    f"nproc_per_node: 2\nrestarts: 1\ncpu_affinity: none\nlogs: {{dir: '{work}/logs'}}\n"
                    + ("" if warm else "warm_start: false\n"))
    return path


def pack(checkout: Path, output: Path) -> None:
    """``clusterddp pack -o OUTPUT`` from ``checkout`` (its own sources)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    subprocess.run([sys.executable, "-m", "clusterddp", "pack", "-o", str(output)], cwd=checkout, env=env,
                   check=True, capture_output=True, timeout=120)


def in_container(bundle: Path, runc_root: Path, ident: str, argv: list[str], cwd: Path) -> list[str]:
    """The command that runs ``argv`` as the bundle's container (its config.json rewritten)."""
    config_path = bundle / "config.json"
    config = json.loads(config_path.read_text())
    config["process"]["args"] = argv
    config["process"]["cwd"] = str(cwd)
    config["process"]["env"] = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                "HOME=/tmp", "OMP_NUM_THREADS=1", "NO_COLOR=1"]
    config_path.write_text(json.dumps(config, indent=2))
    return ["runc", f"--root={runc_root}", "run", "-b", str(bundle), ident]


def latency(argv: list[str], work: Path, env: dict[str, str]) -> tuple[float | str, str]:
    """Seconds from the kill to the next attempt's first step (or why the run failed), and
    the launcher's 'warm start off' line if it printed one."""
    out = work / "out"
    for name in ("killed", "resumed"):
        (out / name).unlink(missing_ok=True)
    proc = subprocess.Popen(argv, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"timed out after {TIMEOUT} s", ""
    text = stderr.decode(errors="replace")
    warm_off = next((line for line in text.splitlines() if "warm start off" in line), "")
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {text.strip().splitlines()[-1:] or ['?']}", warm_off
    return float((out / "resumed").read_text()) - float((out / "killed").read_text()), warm_off


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rootfs", help="mmdebstrap's tar: reused when it exists, else built and kept there")
    parser.add_argument("--before", help="another checkout: its zipapp in the container too")
    args = parser.parse_args()
    reason = containers.unavailable_reason()
    if reason:
        print(f"container_restart: {reason}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="cddp-container-restart-", dir="/var/tmp"))
    work, runc_root = root / "work", root / "runc"
    (work / "out").mkdir(parents=True)
    runc_root.mkdir()
    try:
        tar = Path(args.rootfs) if args.rootfs else root / "rootfs.tar"
        if not tar.exists():
            tar.parent.mkdir(parents=True, exist_ok=True)
            built = containers.build_rootfs(tar.parent)
            if built != tar:
                built.replace(tar)
        containers.make_bundle(root / "bundle", tar, work)
        shutil.copy(WORKER, work / WORKER.name)
        pack(HERE.parent, work / "clusterddp.pyz")
        if args.before:
            pack(Path(args.before).resolve(), work / "before.pyz")
        bare_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
        methods: dict[str, tuple[list[str], dict[str, str]]] = {}
        port = 29710
        for warm in (True, False):
            suffix = "" if warm else ", warm_start: false"
            job = job_file(work, "warm" if warm else "cold", warm)
            methods[f"bare{suffix}"] = ([sys.executable, "-m", "clusterddp", "run", str(job), "--master-port",
                                         str(port)], bare_env)
            methods[f"runc{suffix}"] = (["python3", str(work / "clusterddp.pyz"), "run", str(job), "--master-port",
                                         str(port + 1)], {})
            port += 2
        if args.before:
            methods["runc before"] = (["python3", str(work / "before.pyz"), "run", str(job_file(work, "warm", True)),
                                       "--master-port", str(port)], {})
        results: dict[str, list[float]] = {}
        failures: dict[str, list[str]] = {}
        warm_off: dict[str, str] = {}
        for r in range(args.rounds):
            for name, (argv, env) in methods.items():
                if name.startswith("runc"):
                    ident = f"cddp-restart-{os.getpid()}-{r}-{len(results)}-{len(failures)}"
                    argv = in_container(root / "bundle", runc_root, ident, argv, work)
                    env = dict(os.environ)
                value, off = latency(argv, work, env)
                if name.startswith("runc"):
                    subprocess.run(["runc", f"--root={runc_root}", "delete", "--force", argv[-1]],
                                   capture_output=True, check=False, timeout=30)
                if off:
                    warm_off[name] = off
                shown = value if isinstance(value, str) else f"{value:.2f} s"
                print(f"round {r}: {name}: {shown}", file=sys.stderr)
                if isinstance(value, str):
                    failures.setdefault(name, []).append(value)
                else:
                    results.setdefault(name, []).append(value)
        print(f"restart latency (SIGKILL of rank 1 -> first step of attempt 1), 1 node x 2 gloo workers, "
              f"{args.rounds} rounds, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        print(f"{'method':<28} {'median s':>9} {'min s':>7} {'max s':>7}  runs")
        for name in methods:
            values = results.get(name, [])
            if values:
                print(f"{name:<28} {statistics.median(values):>9.2f} {min(values):>7.2f} {max(values):>7.2f}  "
                      f"{len(values)}/{args.rounds}")
            else:
                print(f"{name:<28} {'-':>9} {'-':>7} {'-':>7}  0/{args.rounds}")
            for why in failures.get(name, []):
                print(f"  failed: {why}")
            if name in warm_off:
                print(f"  said: {warm_off[name].strip()}")
        return 0
    finally:
        left = subprocess.run(["runc", f"--root={runc_root}", "list", "-q"], capture_output=True, text=True,
                              check=False).stdout.split()
        for ident in left:
            subprocess.run(["runc", f"--root={runc_root}", "delete", "--force", ident], capture_output=True,
                           check=False)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
