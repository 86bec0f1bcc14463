"""``clusterddp doctor JOB [--hostfile F]``: is every node fit to run this job, and how fast is the network?

1. Preflight on every node, the same checks ``clusterddp run`` does before starting
   anything (reachable, python/clusterddp/torch versions, GPUs, master port, interface),
   printed as one table row per node, even when some node fails.
2. A short all_reduce and ping-pong test with the job's backend, interpreter, env and
   workers per node, started through the normal launcher (fan-out or local) with the
   built-in worker ``clusterddp.train.bandwidth``; ``netperf`` explains the figures and
   flags a node far below the others.

Exit code: 0 when every node is fine, 1 when a node is flagged slow or the test failed,
2 when preflight failed (nothing was started). The launcher side never imports torch.

It lives in ``launch`` because it is a launch: the SSH fan-out's preflight and run with a
built-in worker; the figures come from the ``netperf`` leaf, shared with that worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Sequence

from clusterddp.devices import cpu_count, gpu_count
from clusterddp.launch.ssh.fanout import FanoutOptions, run_fanout
from clusterddp.launch.ssh.reach import HeadFacts, HostSession
from clusterddp.netperf import SLOW_FRACTION, Measurements, allreduce_table, node_figures, node_table
from clusterddp.protocol import DOCTOR_MARKER
from clusterddp.spec import JobSpec, load_job
from clusterddp.topology import default_run_id

WORKER = ("-m", "clusterddp.train.bandwidth")
#: Seconds the local test may take before it is considered stuck.
LOCAL_TIMEOUT = 600.0


@dataclass(frozen=True)
class DoctorOptions:
    """Where and what to measure. Defaults keep a run to seconds once torch is imported."""

    #: Hosts to test (else the job's ssh.hosts / ssh.hostfile, else this node only).
    hostfile: str | None = None
    sizes: tuple[int, ...] = (8, 65536, 1 << 20)
    iters: int = 5
    partners: int = 3
    slow_fraction: float = SLOW_FRACTION

    def worker_args(self, backend: str) -> list[str]:
        args = ["--sizes", ",".join(str(s) for s in self.sizes), "--iters", str(self.iters),
                "--partners", str(self.partners)]
        return args + (["--backend", backend] if backend != "auto" else [])


class LineCapture:
    """A binary stream for the fan-out's relay: keeps every line; finds the worker's result."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._partial = b""

    def write(self, data: bytes) -> int:
        *complete, self._partial = (self._partial + data).split(b"\n")
        self.lines.extend(line.decode(errors="replace") for line in complete)
        return len(data)

    def flush(self) -> None:
        pass

    def result(self) -> Measurements | None:
        return find_result(self.lines)


def find_result(lines: Sequence[str]) -> Measurements | None:
    """The worker's ``CLUSTERDDP_DOCTOR`` line (behind any ``[host rank 0]`` prefix)."""
    for line in lines:
        if DOCTOR_MARKER in line:
            return Measurements.from_json(json.loads(line.split(DOCTOR_MARKER, 1)[1]))
    return None


def doctor_main(job_path: str, options: DoctorOptions) -> int:
    """Preflight and measure the job's nodes; the exit code of the module's docstring."""
    job = load_job(job_path)
    run_id = default_run_id("doctor")
    if options.hostfile or job.ssh.hosts or job.ssh.hostfile:
        code, measurements, output = _across_hosts(job, options, run_id)
    else:
        code, measurements, output = _on_this_node(job, options, run_id)
    return report(measurements, code, output, options)


def report(m: Measurements | None, code: int, output: Sequence[str], options: DoctorOptions) -> int:
    """Print the tables; without a result, the run's last lines say what went wrong."""
    if m is None:
        print(f"clusterddp doctor: the network test did not report (launcher exit code {code}); last output:")
        print("\n".join(f"  {line}" for line in output[-30:]))
        return code or 1
    rows = node_figures(m, options.slow_fraction)
    print("\n".join(allreduce_table(m)))
    print()
    print("\n".join(node_table(m, rows)))
    slow = [r for r in rows if r.slow]
    if slow:
        print(f"clusterddp doctor: slow node(s): {', '.join(r.host for r in slow)} "
              f"(below {options.slow_fraction:g}x the other nodes' median bandwidth)")
        return 1
    print("clusterddp doctor: no node stands out")
    return 0


def _across_hosts(job: JobSpec, options: DoctorOptions, run_id: str) -> tuple[int, Measurements | None, list[str]]:
    out, err = LineCapture(), LineCapture()
    fanout = FanoutOptions(
        hostfile=options.hostfile, run_id=run_id, stdout=out, stderr=err,  # type: ignore[arg-type]
        command=(*WORKER, *options.worker_args(job.backend)), on_probed=print_preflight,
        launcher_args=("--log-dir", job.logs.dir, "--grace-period", "2"))
    code = run_fanout(replace(job, hang_timeout=None, restarts=0), fanout)
    return code, out.result(), err.lines + out.lines


def _on_this_node(job: JobSpec, options: DoctorOptions, run_id: str) -> tuple[int, Measurements | None, list[str]]:
    facts = HeadFacts.here()
    print("preflight (this node only: no hostfile):")
    print(f"  {'host':<16} {'python':<8} {'clusterddp':<10} {'torch':<10} {'cpus':>4} {'gpus':>4}")
    print(f"  {os.uname().nodename:<16} {facts.python:<8} {facts.clusterddp:<10} {facts.torch or '-':<10} "
          f"{cpu_count():>4} {gpu_count(os.environ):>4}")
    print()
    argv = [sys.executable, "-m", "clusterddp", "run", "--run-id", run_id,
            "--nproc-per-node", str(job.nproc_per_node), "--log-dir", job.logs.dir, "--grace-period", "2",
            *(["--python", job.python] if job.python else []),
            "--", *WORKER, *options.worker_args(job.backend)]
    env = {**os.environ, **job.env}
    env.pop("CLUSTERDDP_HOSTFILE", None)
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=LOCAL_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        lines: list[str] = (exc.stdout or "").splitlines() if isinstance(exc.stdout, str) else []
        return 1, None, lines + [f"(no result within {LOCAL_TIMEOUT:.0f}s)"]
    lines = proc.stderr.splitlines() + proc.stdout.splitlines()
    return proc.returncode, find_result(proc.stdout.splitlines()), lines


def print_preflight(sessions: Sequence[HostSession]) -> None:
    """One row per host from its probe: what the checks are about to compare."""
    print(f"preflight ({len(sessions)} nodes; versions compared with this head: {_head_versions()}):")
    print(f"  {'node':>4}  {'host':<16} {'address':<16} {'python':<8} {'clusterddp':<10} {'torch':<10} "
          f"{'cpus':>4} {'gpus':>4}  {'interface':<10} {'ssh':>6}")
    for s in sessions:
        f = s.facts
        if not f:
            print(f"  {s.node_rank:>4}  {s.host.name:<16} {s.host.address:<16} " + "; ".join(s.problems))
            continue
        route = f.get("route") or {}
        print(f"  {s.node_rank:>4}  {s.host.name:<16} {s.host.address:<16} {f['python']:<8} "
              f"{(f['clusterddp'] or {}).get('version') or '-':<10} {f.get('torch') or '-':<10} "
              f"{f['cpus']:>4} {f['gpus']:>4}  {route.get('dev') or route.get('error') or '-':<10} "
              f"{s.seconds:>5.2f}s")
    print(flush=True)


def _head_versions() -> str:
    facts = HeadFacts.here()
    return f"python {facts.python}, clusterddp {facts.clusterddp}, torch {facts.torch or '-'}"
