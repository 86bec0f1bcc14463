"""From a job and this node's topology to the exact argv, env and files of each worker.

Kept apart from the supervisor so ``--dry-run`` shows precisely what ``run`` would start.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import Mapping

from clusterddp import affinity, protocol
from clusterddp.devices import GpuInventory, cpu_count, gpu_inventory
from clusterddp.errors import LaunchError
from clusterddp.launch.start import bootstrap
from clusterddp.launch.start.workerenv import WorkerEnv
from clusterddp.launch.start.workers import WorkerPlan
from clusterddp.spec import JobSpec
from clusterddp.topology import Topology
from clusterddp.validate import exec_size_problem, shown


def interpreter(job: JobSpec) -> str:
    """The job's ``python:`` or the launcher's own interpreter."""
    return job.python or sys.executable


def run_dir(job: JobSpec, topology: Topology, cwd: str) -> str:
    """``<logs.dir>/<run-id>``; a relative logs.dir starts at the launcher's cwd."""
    return os.path.join(cwd, job.logs.dir, topology.run_id)


def workdir(job: JobSpec, cwd: str) -> str:
    """Where the workers run: the job's ``workdir`` (from the launcher's cwd), else that cwd."""
    return os.path.abspath(os.path.join(cwd, job.workdir)) if job.workdir else cwd


def worker_plans(job: JobSpec, topology: Topology, base_env: Mapping[str, str], cwd: str) -> list[WorkerPlan]:
    """One WorkerPlan per local rank, its environment's inputs in a ``WorkerEnv`` (whose
    ``build`` is the one writer of a worker's variables)."""
    logs = run_dir(job, topology, cwd)
    argv = (interpreter(job), *bootstrap.command(), *job.entry_argv())
    share = max(1, cpu_count() // topology.nproc_per_node)
    gpus = worker_gpus(job, topology, base_env)  # one look at the GPUs for every worker
    binding = cpu_binding(job, topology, gpus)
    plans = []
    for local_rank in range(topology.nproc_per_node):
        rank = topology.global_rank(local_rank)
        cpus = binding.cpus[local_rank]
        error_file = os.path.join(logs, protocol.rank_file_name(rank, protocol.RANK_ERROR))
        env = WorkerEnv(topology, local_rank, launcher=base_env, job=job.env, max_restarts=job.restarts,
                        threads=share if cpus is None else len(cpus),  # one thread per CPU of its own
                        error_file=error_file, stacks_file=os.path.join(logs, protocol.rank_file_name(rank, protocol.RANK_STACKS)),
                        heartbeat_file=os.path.join(logs, protocol.rank_file_name(rank, protocol.RANK_HEARTBEAT)),
                        device=virtual_device(job, local_rank, gpus) if job.virtual_local_rank else None)
        plans.append(WorkerPlan(local_rank=local_rank, rank=rank, argv=argv, env=env, cwd=workdir(job, cwd),
                                log=os.path.join(logs, protocol.rank_file_name(rank, protocol.RANK_LOG)), error_file=error_file,
                                cpus=cpus))
    return plans


def worker_gpus(job: JobSpec, topology: Topology, base_env: Mapping[str, str]) -> GpuInventory:
    """The GPUs the workers use, with their PCI addresses; none looked up for a CPU job."""
    if topology.backend == "nccl" or job.virtual_local_rank:
        return gpu_inventory(base_env)
    return GpuInventory((), "a CPU job")


def cpu_binding(job: JobSpec, topology: Topology, gpus: GpuInventory) -> affinity.Binding:
    """Each worker's CPUs: near its GPU when the workers use GPUs (nccl), else a CPU share."""
    if job.cpu_affinity == "none":
        return affinity.Binding((None,) * topology.nproc_per_node)
    near_gpu: list[tuple[int, ...] | None] = []
    if topology.backend == "nccl":
        near_gpu = [affinity.gpu_local_cpus(g.pci_address) for g in gpus.gpus[:topology.nproc_per_node]]
    return affinity.plan_binding(job.cpu_affinity, topology.nproc_per_node, affinity.read_topology(), near_gpu)


def virtual_device(job: JobSpec, local_rank: int, gpus: GpuInventory) -> str:
    """torchrun's --virtual-local-rank: the worker sees only its GPU, as device 0.

    Its CUDA_VISIBLE_DEVICES: the ``local_rank``-th entry of the launcher's (an index, a UUID or
    a MIG id, passed on as written), or of nvidia-smi's list when that is unset.
    """
    if local_rank >= gpus.count:
        raise LaunchError(f"{job.where('virtual_local_rank')}: local rank {local_rank} has no GPU of its own: "
                          f"this node has {gpus.count} visible GPU(s) ({gpus.source})",
                          "one worker per GPU (nproc_per_node: auto), or drop virtual_local_rank")
    return gpus.gpus[local_rank].entry


def check_runnable(job: JobSpec, plans: list[WorkerPlan]) -> None:
    """Fail with one line, before any log file or process exists, when a worker could not
    start: the interpreter (a bare name is looked up on the workers' PATH, as exec will), the
    workdir, the script, the size of argv + environment (E2BIG), the log directory."""
    if not plans:
        return
    first = plans[0]
    _check_interpreter(job, first)
    if not os.path.isdir(first.cwd):
        raise LaunchError(f"{job.where('workdir')}: {shown(first.cwd, 200)} is not a directory")
    if job.script is not None and not job.module:
        script = os.path.join(first.cwd, job.script_path())
        if not os.path.isfile(script):
            raise LaunchError(f"{job.where('script')}: no such file: {shown(script, 200)}")
    for plan in plans:
        problem = exec_size_problem(plan.argv, plan.env.build(0))
        if problem:
            key = "args" if problem.startswith("argument ") else "env"
            raise LaunchError(f"{job.where(key)}: the worker cannot be started: {problem}")
    _check_log_dir(job, os.path.dirname(first.log))


def _check_interpreter(job: JobSpec, plan: WorkerPlan) -> None:
    python = plan.argv[0]
    if os.sep not in python:
        found = shutil.which(python, path=plan.env.build(0).get("PATH", os.defpath))
        if found is None:
            raise LaunchError(f"{job.where('python')}: {shown(python)} is not on the workers' PATH",
                              "give a path, or a name found on PATH")
        python = found
    if os.path.isdir(python):
        raise LaunchError(f"{job.where('python')}: {shown(python, 200)} is a directory, not an interpreter")
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise LaunchError(f"{job.where('python')}: {shown(python, 200)} is not an executable file")


def _check_log_dir(job: JobSpec, run_dir: str) -> None:
    """The nearest existing ancestor of the run's log directory must be a writable directory."""
    path = os.path.abspath(run_dir)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise LaunchError(f"{job.where('logs.dir')}: {shown(path, 200)} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchError(f"{job.where('logs.dir')}: {shown(path, 200)} is not writable")


def prepare_logs(plans: list[WorkerPlan], keep: bool = False) -> None:
    """Create the run's log directory and one empty log per rank (after every check passed).

    ``keep``: a restart of the whole job (same run id) appends to the earlier attempts' logs."""
    for plan in plans:
        try:
            os.makedirs(os.path.dirname(plan.log), exist_ok=True)
            open(plan.log, "ab" if keep else "wb").close()
        except OSError as exc:
            raise LaunchError(f"logs.dir: cannot create {shown(plan.log, 200)}: {exc.strerror}") from None


def dry_run_text(job: JobSpec, topology: Topology, plans: list[WorkerPlan], base_env: Mapping[str, str]) -> str:
    """The topology table and, per worker, argv and the env that differs from the launcher's:
    what ``WorkerEnv.build`` writes for the first start (all but the launcher's marker)."""
    lines = [
        f"job {job.name}: {topology.nnodes} node(s) x {_workers_text(topology)} = "
        f"world size {topology.world_size}, backend {topology.backend}",
        f"environment: {topology.env}; master {topology.master_addr}:{topology.master_port}; "
        f"run id {topology.run_id}",
    ]
    lines.extend(f"note: {note}" for note in topology.notes)
    lines.append(f"cpu affinity: {job.cpu_affinity}")
    binding = cpu_binding(job, topology, worker_gpus(job, topology, base_env))
    lines.extend(f"note: {note}" for note in binding.notes)
    lines.append("")
    lines.append(f"{'node rank':>9}  {'host':<24} global ranks")
    for node in _table_nodes(topology):
        if node < 0:
            lines.append(f"{'...':>9}  ({topology.nnodes} nodes in all; first, this and last shown)")
            continue
        host = topology.hosts[node] if node < len(topology.hosts) else (
            topology.host if node == topology.node_rank else "?")
        ranks = topology.node_ranks(node)
        mark = "  <- this node" if node == topology.node_rank else ""
        lines.append(f"{node:>9}  {host:<24} {ranks.start}-{ranks.stop - 1}{mark}")
    for plan in plans:
        lines.append("")
        lines.append(f"rank {plan.rank} (local {plan.local_rank}): cd {plan.cwd}")
        lines.append("  argv: " + shlex.join(plan.argv))
        lines.append(f"  log:  {plan.log}")
        lines.append("  cpus: " + ("not bound" if plan.cpus is None else affinity.format_cpulist(plan.cpus)))
        env = plan.env.build(topology.first_attempt)
        for key in sorted(env):
            if base_env.get(key) != env[key]:
                lines.append(f"  {key}={env[key]}")
    return "\n".join(lines)


def _workers_text(topology: Topology) -> str:
    if topology.node_workers and len(topology.node_workers) <= 16:
        return "(" + "+".join(str(n) for n in topology.node_workers) + ") worker(s)"
    if topology.node_workers:
        return f"{min(topology.node_workers)}-{max(topology.node_workers)} worker(s)"
    return f"{topology.nproc_per_node} worker(s)"


def _table_nodes(topology: Topology, shown_nodes: int = 16) -> list[int]:
    """The node rows of the dry run's table: all of a small job; of a large one the first
    few, this node and the last, with -1 where rows are left out (bounded output)."""
    if topology.nnodes <= shown_nodes:
        return list(range(topology.nnodes))
    keep = sorted({*range(shown_nodes // 2), topology.node_rank, topology.nnodes - 1})
    rows: list[int] = []
    for node in keep:
        if rows and node != rows[-1] + 1:
            rows.append(-1)
        rows.append(node)
    return rows
