"""Where every worker of the job sits: this node's share of the world and the ranks.

``resolve`` combines what the cluster environment says (``Placement``) with the job file;
``Topology`` does the rank arithmetic (torch elastic's assignment), which
``launch.start.workerenv.WorkerEnv`` writes into each worker's environment under torchrun's names.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import dataclass
from typing import Mapping

from clusterddp.devices import GpuInventory, cpu_count, gpu_inventory
from clusterddp.envs.base import Placement
from clusterddp.errors import EnvironmentDetectionError, LaunchError
from clusterddp.spec import JobSpec, NprocPerNode
from clusterddp.validate import nodes_problem, port_problem, token_problem, workers_problem

#: Derived master ports fall in [PORT_BASE, PORT_BASE + PORT_SPAN): above the well-known and
#: registered ranges people configure by hand, below Linux's default ephemeral range (32768+),
#: so a derived port does not collide with outgoing connections' ports.
PORT_BASE = 20000
PORT_SPAN = 12000
#: Workers of ``nproc_per_node: auto`` on a node without a visible GPU: enough to exercise
#: DDP (gradient all-reduce, sharded data) without taking every core of a laptop or login
#: node; ``cpu`` asks for one per core.
CPU_AUTO_WORKERS = 2


@dataclass(frozen=True)
class Topology:
    """The job's shape as seen from this node."""

    env: str
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    run_id: str
    backend: str
    host: str
    hosts: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    #: Workers of every node, in node-rank order, when nodes differ (hosts with different
    #: slots); empty when every node runs ``nproc_per_node``.
    node_workers: tuple[int, ...] = ()
    #: The attempt of a job restarted as a whole from outside (``--restart-count``, or the
    #: scheduler's retry number, see ``Placement.restart_count``); None: local restarts apply.
    restart_count: int | None = None

    @property
    def world_size(self) -> int:
        if self.node_workers:
            return sum(self.node_workers)
        return self.nnodes * self.nproc_per_node

    def first_rank(self, node_rank: int) -> int:
        """The global rank of a node's local rank 0: the prefix sum of the workers of the
        nodes before it (torch elastic's assignment), ``node_rank * nproc_per_node`` when
        every node is equal."""
        if self.node_workers:
            return sum(self.node_workers[:node_rank])
        return node_rank * self.nproc_per_node

    def workers_on(self, node_rank: int) -> int:
        return self.node_workers[node_rank] if self.node_workers else self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        """global rank = first rank of this node + local_rank (node_rank * nproc_per_node +
        local_rank when every node runs as many workers)."""
        return self.first_rank(self.node_rank) + local_rank

    def node_ranks(self, node_rank: int | None = None) -> range:
        """Global ranks of one node (this one by default)."""
        node = self.node_rank if node_rank is None else node_rank
        first = self.first_rank(node)
        return range(first, first + self.workers_on(node))

    @property
    def first_attempt(self) -> int:
        """TORCHELASTIC_RESTART_COUNT of this launcher's first start of its workers."""
        return self.restart_count or 0


def derive_port(run_id: str) -> int:
    """A port every node computes alike from the run id, without talking to the others."""
    digest = hashlib.sha256(run_id.encode()).digest()
    return PORT_BASE + int.from_bytes(digest[:4], "big") % PORT_SPAN


def free_port(addr: str = "127.0.0.1") -> int:
    """A port the kernel says is free now, here: for a single node, or for node 0 that picks
    the next master port and tells the others (stepcoord's restart in place)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return int(sock.getsockname()[1])


def check_master_port_free(addr: str, port: int) -> None:
    """The master's port checked on this node, when ``addr`` belongs to it (else nothing here
    can say whether the port is free there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, 0))
        except OSError:
            return
    check_port_free("", port)


def check_port_free(addr: str, port: int) -> None:
    """Fail early, with one line, when the master port is taken on this (master) node."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr, port))
        except OSError as exc:
            raise LaunchError(f"master port {port} on {addr} is not available: {exc.strerror}",
                              "choose another with --master-port or master.port in the job file") from None


#: What ``count_workers`` counted.
CPU_CORES, VISIBLE_GPUS, SCHEDULED = "CPU cores", "visible GPUs", "the scheduler's count"


def count_workers(request: NprocPerNode, gpus: int, cpus: int, scheduled: int | None = None) -> tuple[int, str]:
    """Workers on one node for ``nproc_per_node``, and what the count is; the one rule for this
    node and for every host of a fan-out (counted there from the host's probe).

    A number as given; ``cpu``: one per core; ``gpu``: what the scheduler gave, else one per
    visible GPU (0 without one: the caller names that problem); ``auto``: the scheduler's count,
    else one per visible GPU, else ``CPU_AUTO_WORKERS`` (torchrun's ``auto`` takes every core:
    ask for that with ``cpu``).
    """
    if isinstance(request, int):
        return request, "nproc_per_node"
    if request == "cpu":
        return cpus, CPU_CORES
    if request == "gpu" and gpus == 0:
        return 0, VISIBLE_GPUS
    if scheduled:
        return scheduled, SCHEDULED
    if gpus:
        return gpus, VISIBLE_GPUS
    return CPU_AUTO_WORKERS, "auto without a GPU"


def torchrun_word(word: str, gpus: int) -> NprocPerNode:
    """A scheduler's ``auto``/``gpu``/``cpu`` (Kubeflow's ``PET_NPROC_PER_NODE``) as torchrun
    counts it: ``auto`` is one worker per visible GPU, else one per CPU (this node's
    ``cpu_count``: the pod's CPU limit, as the torch plugin counts a CPU-only TrainJob's)."""
    if word == "auto":
        return "gpu" if gpus else "cpu"
    return "gpu" if word == "gpu" else "cpu"


def resolve_nproc(job: JobSpec, placement: Placement, env: Mapping[str, str],
                  gpus: GpuInventory | None = None) -> int:
    """Workers on this node (``count_workers``), each count within the bound of a typed one."""
    request = job.nproc_per_node
    if isinstance(request, int):
        problem = workers_problem(request)
        if problem:
            raise LaunchError(f"{job.where('nproc_per_node')}: {problem}")
        return request
    inventory = gpus if gpus is not None else gpu_inventory(env, query=False)
    where = job.where('nproc_per_node')
    if request == "auto" and placement.nproc_per_node is None and placement.nproc_word is not None:
        request, where = torchrun_word(placement.nproc_word, inventory.count), f"{placement.env}: workers per node"
    count, what = count_workers(request, inventory.count, cpu_count() if request == "cpu" else 0,
                                placement.nproc_per_node)
    if request == "gpu" and count == 0:
        raise EnvironmentDetectionError(
            f"{where}: 'gpu' but this node has no visible GPU ({inventory.source})",
            "use 'auto' or a number to run on CPU slots")
    if what == SCHEDULED:
        problem = workers_problem(count)
        if problem:
            raise EnvironmentDetectionError(f"{placement.env}: workers per node: {problem}")
        return count
    if what == CPU_CORES:
        return _bounded(job, count, what)
    if what == VISIBLE_GPUS:
        return _bounded(job, count, f"{what} ({inventory.source})")
    return count


def _bounded(job: JobSpec, count: int, what: str) -> int:
    """A worker count read from the machine passes the same bound as a typed one."""
    problem = workers_problem(count)
    if problem:
        raise LaunchError(f"{job.where('nproc_per_node')}: {job.nproc_per_node!r} gives {count} {what}: {problem}")
    return count


def check_gpu_workers(job: JobSpec, nproc: int, backend: str, gpus: GpuInventory) -> None:
    """nccl needs a GPU per worker: two ranks on one GPU die in CUDA or NCCL ("invalid device
    ordinal", "duplicate GPU detected") with a 20-line traceback, long after the start."""
    if backend != "nccl" or nproc <= gpus.count:
        return
    raise EnvironmentDetectionError(
        f"{job.where('nproc_per_node')}: {nproc} nccl worker(s) but this node has {gpus.count} visible "
        f"GPU(s) ({gpus.source})",
        "one worker per GPU: nproc_per_node auto (or a smaller number); or backend: gloo to run on CPU")


def resolve(job: JobSpec, placement: Placement, env: Mapping[str, str],
            master_port: int | None = None, nnodes: int | None = None,
            node_workers: tuple[int, ...] | None = None, restart_count: int | None = None) -> Topology:
    """Combine the environment's placement with the job file into this node's Topology.

    Precedence for the master: the environment's answer, then the job file's ``master``;
    for the port, then (one node) a free port or (several nodes) one derived from the run id.
    ``node_workers`` (``--workers-per-node 2,1,1``, from the SSH head) gives every node's
    worker count, so ranks are prefix sums and this node runs its own entry.
    ``restart_count`` (``--restart-count``) wins over the scheduler's retry number.
    """
    if nnodes is not None and nnodes != placement.nnodes:
        raise EnvironmentDetectionError(
            f"{placement.env} says this job has {placement.nnodes} node(s) but --nnodes says {nnodes}",
            "drop --nnodes, or also give --node-rank and --master-addr to place this node by hand")
    _check_placement(placement)
    gpus = gpu_inventory(env, query=False)
    nproc = resolve_nproc(job, placement, env, gpus)
    layout = check_node_workers(node_workers, placement, nproc) if node_workers else ()
    run_id = placement.run_id or env.get("CLUSTERDDP_RUN_ID") or default_run_id(job.name, placement.nnodes)
    if token_problem(run_id, "a run id"):  # it names the log directory: never a path
        raise EnvironmentDetectionError(f"{placement.env}: run id: {token_problem(run_id, 'a run id')}")
    addr = placement.master_addr or job.master.addr
    if addr is None:
        raise EnvironmentDetectionError(
            f"{placement.env}: no master address for a {placement.nnodes}-node job",
            "give --master-addr or master.addr in the job file")
    port = choose_port(run_id, master_port, placement.master_port, job.master.port,
                       here=placement.nnodes == 1 and is_loopback(addr))
    if port_problem(port):
        raise EnvironmentDetectionError(f"{placement.env}: master port: {port_problem(port)}")
    backend = job.backend if job.backend != "auto" else ("nccl" if gpus.count > 0 else "gloo")
    check_gpu_workers(job, nproc, backend, gpus)
    return Topology(env=placement.env, nnodes=placement.nnodes, node_rank=placement.node_rank,
                    nproc_per_node=nproc, master_addr=addr, master_port=port, run_id=run_id,
                    backend=backend, host=socket.gethostname(), hosts=placement.hosts,
                    notes=placement.notes, node_workers=layout,
                    restart_count=placement.restart_count if restart_count is None else restart_count)


def check_node_workers(node_workers: tuple[int, ...], placement: Placement, nproc: int) -> tuple[int, ...]:
    """``--workers-per-node`` must describe this job: one count per node, this node's equal
    to the workers it runs. Equal counts collapse to the plain formula (empty layout)."""
    if len(node_workers) != placement.nnodes:
        raise EnvironmentDetectionError(
            f"--workers-per-node gives {len(node_workers)} node(s) but the job has {placement.nnodes} "
            f"(placement: {placement.env})")
    if node_workers[placement.node_rank] != nproc:
        raise EnvironmentDetectionError(
            f"--workers-per-node gives node {placement.node_rank} {node_workers[placement.node_rank]} "
            f"worker(s) but it runs {nproc} (--nproc-per-node)")
    return () if len(set(node_workers)) == 1 else node_workers


def _check_placement(placement: Placement) -> None:
    """The one place every environment's answer passes: node count and rank bounded, so a
    typo like 10**26 nodes is one line instead of a loop (or a 700 MB dry run)."""
    problem = nodes_problem(placement.nnodes)
    if problem:
        raise EnvironmentDetectionError(f"{placement.env}: number of nodes {problem}")
    if not 0 <= placement.node_rank < placement.nnodes:
        raise EnvironmentDetectionError(
            f"{placement.env}: node rank {placement.node_rank} is outside 0..{placement.nnodes - 1}")


def default_run_id(name: str, nnodes: int = 1) -> str:
    """The run id when none is given. Several nodes started by hand must agree on it (it seeds
    the port), so it is the job name; one node, or a head that hands its id to every node, gets
    a unique id so its logs do not overwrite the last run's."""
    if nnodes > 1:
        return name
    return f"{name[:96]}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def choose_port(run_id: str, *given: int | None, here: bool = False) -> int:
    """The master port: the first one given (flag, environment, job file); else a free one when
    this machine is the whole job (``here``); else one every node derives from the run id."""
    for port in given:
        if port:
            return port
    return free_port() if here else derive_port(run_id)


def is_loopback(addr: str | None) -> bool:
    """True for an address only this machine can reach (localhost, 127.0.0.0/8, ::1)."""
    return addr is not None and (addr in ("localhost", "::1") or addr.startswith("127."))
