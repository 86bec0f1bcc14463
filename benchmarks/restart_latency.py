"""Restart latency on one node, side by side: from a SIGKILL of a worker to the first completed
step of the next attempt.

Two gloo workers run benchmarks/kill_at_step.py; at step 20 of attempt 0 rank 1 records the
wall time and SIGKILLs itself (`restarts: 1`, every other setting the job's default); rank 0
of attempt 1 records when its first all_reduce completed. clusterddp (warm start, the
default for a script that imports torch), clusterddp with `warm_start: false`, torchrun
`--max-restarts 1` twice, and optionally another checkout's clusterddp (``--before
/work/main``), on the same script, interleaved round by round so a busy moment hurts all alike.
The two torchrun rows are named for what they are (both c10d rendezvous on 127.0.0.1):
"torchrun" as users run it, and "torchrun, store not shared" with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in its environment (the workers then make their own
store instead of reusing the agent's, where attempt 1's rank 0 can read attempt 0's dead rank
1 address and time out: see methods). No other row gets that variable. ``--timeout S`` ends a
run that hangs (default 300 s; a torchrun restart can hang).

    .venv/bin/python benchmarks/restart_latency.py [--rounds 5] [--before /work/main] [--timeout 300]

With ``--ssh`` the same script runs over SSH instead, on the test bed of tests/ssh (2 sshd hosts,
each a network namespace; needs root; the bed holds /run/cdssh.lock itself): 1 gloo worker per host, rank 1
SIGKILLed at step 20, `restarts: 1`, the job's defaults otherwise; the head (this checkout, and
``--before``'s) restarts the whole job, from the kill to rank 0's first step of attempt 1:

    .venv/bin/python benchmarks/restart_latency.py --ssh [--before /work/main]

``--slurm``: the same on the SLURM test bed instead (tests/testbed/slurm_cluster.py: root,
slurmctld/slurmd in network namespaces; the bed holds /run/cdslurm.lock itself): 2 nodes x 1 worker,
`restarts: 1`, default settings, submitted with `clusterddp submit slurm`; the kill to the
next attempt's first step, this checkout and ``--before``'s, interleaved round by round.

``--ssh-dead-host``: a dead host over SSH, on a 3-host bed of tests/ssh (root; /run/cdssh.lock):
job ``nodes: "2:3"``, 1 gloo worker per host, `restarts: 1`, the job's defaults otherwise
(``--grace-period S`` sets grace_period; the tests use 2). At step 20 of attempt 0 the rank on
the last host writes OUT/dying and goes on; the benchmark then cuts that host's link and
SIGKILLs every process in it, sshd included (tests/ssh/test_fault_tolerance.py's dead host):
the fault is the time.time() right after the cut. Measured: from the fault to rank 0's first
completed step of attempt 1, on the 2 live hosts. Two workers, a row each: "no SIGTERM handler"
(a survivor blocked in all_reduce with its dead peer dies at its launcher's SIGTERM) and "SIGTERM
handled" (a handler that only sets a flag, as clusterddp.train's; blocked in gloo it never
runs, so the launcher SIGKILLs the worker after grace_period: that row shows what grace_period
costs). Each run has its own run id, must leave nothing running on any host (a leftover
fails it), and the dead host is brought back (link up, sshd restarted) for the next one;
``--before`` and ``--rounds`` as above:

    .venv/bin/python benchmarks/restart_latency.py --ssh-dead-host [--grace-period 2]

Target (issue 25): clusterddp's median <= 1.5 s on a 2-core machine, on one node, over SSH and
under SLURM; a dead host over SSH (link cut) <= grace_period + 2 s.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from tests.testbed import LabHost, SSHLab

HERE = Path(__file__).resolve().parent
WORKER = HERE / "kill_at_step.py"


@dataclass(frozen=True)
class Method:
    """One row: the command, the checkout it runs from (None: this one), and the variables it
    gets beyond the benchmark's own (named in the row's name when there are any)."""

    argv: list[str]
    checkout: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)


def job_file(directory: str, out: str, warm: bool) -> str:
    path = os.path.join(directory, f"job-{'warm' if warm else 'cold'}.yaml")
    with open(path, "w") as f:
        f.write(f"name: restart-latency\nscript: {WORKER}\nargs: ['{out}', '20']\nnproc_per_node: 2\n"
                f"restarts: 1\nlogs: {{dir: '{directory}/logs'}}\n" + ("" if warm else "warm_start: false\n"))
    return path


#: The variable that makes torchrun's workers keep their own store (torch.distributed.elastic):
#: set for the one row named for it, never for another.
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun(port: int, out: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", str(WORKER), out, "20"]


def methods(directory: str, out: str, port: int, before: str | None) -> dict[str, Method]:
    """name -> how to run it."""
    found = {
        "clusterddp": Method([sys.executable, "-m", "clusterddp", "run", job_file(directory, out, True),
                              "--master-port", str(port)]),
        "clusterddp cold": Method([sys.executable, "-m", "clusterddp", "run", job_file(directory, out, False),
                                   "--master-port", str(port + 1)]),
        # As users run it: c10d shares the agent's store with the workers, and attempt 1's rank 0
        # can read attempt 0's dead rank 1 address from it and time out (torch 2.14.1: 0 of 5
        # runs recovered in issue 32's rounds; torchrun's default static rendezvous does the same).
        "torchrun": Method(torchrun(port + 2, out)),
        # The same with the store not shared: the variable named in the row.
        "torchrun, store not shared (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)": Method(
            torchrun(port + 4, out), env=NO_SHARED_STORE),
    }
    if before:
        found["clusterddp before"] = Method([sys.executable, "-m", "clusterddp", "run",
                                             job_file(directory, out, True), "--master-port", str(port + 3)], before)
    return found


def latency(argv: list[str], out: str, checkout: str | None, extra_env: Mapping[str, str] | None = None,
            timeout: float = 300.0) -> float | str:
    """Seconds from the kill to the next attempt's first step, or why the run failed."""
    for name in ("killed", "resumed"):
        if os.path.exists(os.path.join(out, name)):
            os.unlink(os.path.join(out, name))
    env = {k: v for k, v in os.environ.items() if k not in NO_SHARED_STORE}
    env.update(OMP_NUM_THREADS="1", **(extra_env or {}))
    if checkout:
        env["PYTHONPATH"] = checkout
    proc = subprocess.Popen(argv, env=env, cwd=checkout or os.getcwd(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a launcher that hangs: its workers go with it (torchrun leaves them)
        os.killpg(proc.pid, signal.SIGKILL)
        # torchrun's workers run in sessions of their own: killpg misses them, and they hold the
        # stderr pipe open, so without this the read below would wait for them forever.
        _end_workers(out)
        proc.communicate()
        return f"timed out after {timeout:g} s"
    finally:
        _end_workers(out)
    if proc.returncode != 0:
        # The worker's own error, not torchrun's wrapper around it ("ChildFailedError:", empty).
        errors = [line for line in stderr.decode(errors="replace").splitlines()
                  if "Error" in line and "ChildFailedError" not in line]
        return f"exit {proc.returncode}: {(errors or ['?'])[-1][:160]}"
    with open(os.path.join(out, "killed")) as k, open(os.path.join(out, "resumed")) as r:
        return float(r.read()) - float(k.read())


def _end_workers(out: str) -> None:
    """SIGKILL every worker this benchmark started that is still running: a process whose argv
    names this run's stamp directory ``out`` (unique to the run: a tempfile directory)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if str(WORKER).encode() in argv and out.encode() in argv:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def ssh_methods(lab_root: str, ssh_config: str, hostfile: str, out: str, round_: int,
                before: str | None) -> dict[str, Method]:
    """The SSH case: a head per checkout, 2 hosts x 1 worker, a run id of its own per round."""
    path = os.path.join(lab_root, "restart-latency-ssh.yaml")
    with open(path, "w") as f:
        f.write(f"name: restart-latency-ssh\nscript: {WORKER}\nargs: ['{out}', '20']\nnproc_per_node: 1\n"
                f"restarts: 1\npython: {sys.executable}\nlogs: {{dir: '{lab_root}/logs'}}\n"
                f"ssh: {{config_file: '{ssh_config}'}}\n")
    found = {"clusterddp ssh": Method([sys.executable, "-m", "clusterddp", "run", path, "--hostfile", hostfile,
                                       "--run-id", f"after{round_}"])}
    if before:
        found["clusterddp ssh before"] = Method([sys.executable, "-m", "clusterddp", "run", path, "--hostfile",
                                                hostfile, "--run-id", f"before{round_}"], before)
    return found


#: The dead-host rows: the worker's flags (benchmarks/kill_at_step.py) per variant.
DEAD_HOST_VARIANTS = {"no SIGTERM handler": (), "SIGTERM handled": ("--sigterm-flag",)}


def dead_host_main(rounds: int, grace_period: float | None, before: str | None, first: bool = False
                   ) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """``rounds`` x (each variant x each checkout) dead-host runs on a 3-host bed, interleaved."""
    sys.path.insert(0, str(HERE.parent))
    from tests.testbed import ssh_lab

    results: dict[str, list[float]] = {}
    failures: dict[str, list[str]] = {}
    checkouts = {"": None, **({" before": before} if before else {})}
    with ssh_lab(3) as lab:
        for r in range(rounds):
            for suffix, checkout in checkouts.items():
                for variant, flags in DEAD_HOST_VARIANTS.items():
                    run_id = f"dead-{'before' if checkout else 'after'}-{'flag' if flags else 'plain'}-{r}"
                    value = dead_host_latency(lab, run_id, flags, grace_period, checkout, first)
                    print(f"{run_id}: {value if isinstance(value, str) else f'{value:.2f} s'}", file=sys.stderr)
                    if isinstance(value, str):
                        failures.setdefault(variant + suffix, []).append(f"{run_id}: {value}")
                    else:
                        results.setdefault(variant + suffix, []).append(value)
    return results, failures


def dead_host_latency(lab: SSHLab, run_id: str, flags: Sequence[str], grace_period: float | None,
                      checkout: str | None, first: bool = False) -> float | str:
    """One run: 3 hosts, ``nodes: "2:3"``; at step 20 the last host (``first``: node 0, the master) dies (its link cut, every
    process in it SIGKILLed, sshd included). Seconds from that moment to the first completed step
    of the next attempt (on the 2 live hosts), or why the run failed. Anything of the job left on
    a host afterwards fails the run (and is ended). The dead host is brought back either way."""
    from tests.testbed import namespaces

    directory = os.path.join(lab.root, run_id)
    out = os.path.join(directory, "out")
    os.makedirs(out)
    job = os.path.join(directory, "job.yaml")
    with open(job, "w") as f:
        worker_args = [out, "20", "--dying", *flags, *(["--dying-rank", "0"] if first else [])]
        f.write(f"name: restart-latency-dead-host\nscript: {WORKER}\nargs: {worker_args!r}\n"
                f"nodes: '2:3'\nnproc_per_node: 1\nrestarts: 1\npython: {sys.executable}\n"
                f"logs: {{dir: '{directory}/logs'}}\nssh: {{config_file: '{lab.ssh_config}'}}\n"
                + (f"grace_period: {grace_period}\n" if grace_period is not None else ""))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("CLUSTERDDP_HOSTFILE", None)
    if checkout:
        env["PYTHONPATH"] = checkout
    dead = lab.hosts[0 if first else -1]
    with open(os.path.join(directory, "head.err"), "wb") as stderr:
        head = subprocess.Popen([sys.executable, "-m", "clusterddp", "run", job, "--hostfile", str(lab.hostfile),
                                 "--run-id", run_id], env=env, cwd=checkout or os.getcwd(),
                                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:
        value = _dead_host_run(lab, dead, out, head, directory)
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        clean, _, left = lab.wait_clean(15)
        if not clean:
            namespaces.terminate([pid for pids in left.values() for pid in pids])
        lab.restore(dead)
        lab.restart_sshd(dead)
    return value if clean else f"left running after the run: {left}"


def _dead_host_run(lab: SSHLab, host: LabHost, out: str, head: subprocess.Popen[bytes],
                   directory: str) -> float | str:
    """Wait for the worker's ``dying`` stamp; kill ``host``: its link cut (the fault: time.time()
    right after), then SIGKILL every process in it, sshd included, until none is left; wait for
    the head; the seconds from the fault to OUT/resumed, or why the run failed."""
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "dying")):
        if head.poll() is not None:
            return f"the head exited ({head.returncode}) before step 20"
        if time.monotonic() > deadline:
            return "no rank reached step 20 in 120 s"
        time.sleep(0.01)
    with open(os.path.join(out, "dying")) as f:
        where = f.read().split()[1]
    if where != host.name:
        return f"the last rank ran on {where}, not on {host.name}"
    lab.cut(host)
    fault = time.time()
    deadline = time.monotonic() + 10
    while (pids := lab.processes(host, include_sshd=True)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    try:
        code = head.wait(timeout=300)
    except subprocess.TimeoutExpired:
        return "timed out after 300 s"
    if code != 0:
        with open(os.path.join(directory, "head.err"), errors="replace") as f:
            errors = [line for line in f.read().splitlines() if "rror" in line or "failed" in line]
        return f"exit {code}: {(errors or ['?'])[-1][:160]} (see {directory}/head.err)"
    if not os.path.exists(os.path.join(out, "resumed")):
        return "exit 0 without a resumed step"
    with open(os.path.join(out, "resumed")) as f:
        return float(f.read()) - fault


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
    parser.add_argument("--ssh", action="store_true", help="over SSH on the test bed (2 hosts x 1 worker)")
    parser.add_argument("--slurm", action="store_true", help="the SLURM test bed case (root; 2 nodes x 1 worker)")
    parser.add_argument("--ssh-dead-host", action="store_true",
                        help="a dead host over SSH on the test bed (root; 3 hosts x 1 worker, nodes 2:3)")
    parser.add_argument("--first", action="store_true", help="--ssh-dead-host: node 0 (the master) dies, not the last")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="a run still going after S seconds is ended and counted as failed (default 300)")
    parser.add_argument("--grace-period", type=float, metavar="S",
                        help="--ssh-dead-host: the job's grace_period (default: the job's default)")
    args = parser.parse_args()
    if args.ssh_dead_host:
        results, failures = dead_host_main(args.rounds, args.grace_period, args.before, args.first)
        grace = args.grace_period if args.grace_period is not None else _default_grace_period()
        print(f"SSH test bed, 3 hosts x 1 gloo worker, nodes 2:3, at step 20 {'node 0' if args.first else 'the last host'}'s"
              " link cut and every "
              f"process in it SIGKILLed, restarts 1; grace_period {grace:g} s, target <= {grace + 2:g} s; "
              f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        _table(results, failures)
        return
    if args.slurm:
        results, failures = slurm_main(args.rounds, args.before)
        print(f"SLURM test bed, 2 nodes x 1 gloo worker, rank 1 SIGKILLed at step 20, restarts 1; "
              f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        _table(results, failures)
        return
    directory = tempfile.mkdtemp(prefix="restart-latency-")
    out = os.path.join(directory, "stamps")
    os.makedirs(out)
    if args.ssh:
        sys.path.insert(0, str(HERE.parent))
        from tests.testbed import ssh_lab

        with ssh_lab(2) as lab:
            results, failures = _measure(args.rounds, lambda r: ssh_methods(
                str(lab.root), str(lab.ssh_config), str(lab.hostfile), out, r, args.before), out, args.timeout)
        title = "SSH test bed, 2 hosts x 1 gloo worker"
    else:
        results, failures = _measure(args.rounds, lambda r: methods(directory, out, 29900 + 10 * r, args.before),
                                     out, args.timeout)
        title = "2 gloo workers"
    print(f"{title}, rank 1 SIGKILLed at step 20, restarts 1; {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    _table(results, failures)


def _measure(rounds: int, round_methods: Callable[[int], dict[str, Method]],
             out: str, timeout: float = 300.0) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """Every method once per round, interleaved so a busy moment hurts all alike."""
    results: dict[str, list[float]] = {}
    failures: dict[str, list[str]] = {}
    for r in range(rounds):
        for name, method in round_methods(r).items():
            value = latency(method.argv, out, method.checkout, method.env, timeout)
            if isinstance(value, str):
                failures.setdefault(name, []).append(value)
            else:
                results.setdefault(name, []).append(value)
    return results, failures


def _default_grace_period() -> float:
    """The job's default grace_period (clusterddp.spec), for the title when none is given."""
    sys.path.insert(0, str(HERE.parent))
    from clusterddp.spec import JobSpec

    return JobSpec.grace_period  # a dataclass field's default is the class attribute


def _table(results: dict[str, list[float]], failures: dict[str, list[str]]) -> None:
    """One row per launcher that recovered at least once, with how many runs it recovered in;
    then, per launcher, the runs that failed (a row that never recovered is only there)."""
    width = max([22, *(len(name) for name in results)])
    print(f"{'launcher':<{width}} {'recovered':>9} {'median s':>9} {'min s':>7} {'max s':>7}  all")
    for name, values in results.items():
        runs = len(values) + len(failures.get(name, []))
        print(f"{name:<{width}} {f'{len(values)}/{runs}':>9} {statistics.median(values):>9.2f} {min(values):>7.2f} "
              f"{max(values):>7.2f}  " + " ".join(f"{v:.2f}" for v in values))
    for name, reasons in failures.items():
        runs = len(reasons) + len(results.get(name, []))
        print(f"{name}: {len(reasons)} of {runs} run(s) failed, not counted; last: {reasons[-1]}")


if __name__ == "__main__":
    main()
