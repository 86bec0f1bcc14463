"""SLURM: one ``clusterddp run`` per node (per-node mode), started by ``srun --ntasks-per-node=1``.

Three situations look alike in the environment, and each needs a different answer:

- Inside an srun step with one task per node (what the rendered sbatch script runs): this
  node is ``SLURM_NODEID`` of the step's nodes; the master is the first host of the step's
  nodelist; every node derives the same port from the job id.
- Inside an srun step with several tasks on a node (``srun -n 8 python train.py``, one task
  per GPU): per-task mode. Each task is already a worker, so a launcher here would start
  workers of workers. That is refused with a pointer to ``clusterddp.train.init_distributed``,
  which reads ``SLURM_PROCID`` directly.
- In the batch script itself (or an ``salloc`` shell), outside any step: there is no
  ``SLURM_STEP_ID`` and ``SLURM_NODEID``/``SLURM_PROCID`` are 0 on the first node only.
  ``relaunch`` turns ``clusterddp run`` into ``srun --ntasks-per-node=1 clusterddp run`` so
  a launcher starts on every node; the relaunched ones see ``SLURM_STEP_ID`` and stay put.

Scope traps (reference/slurm.md): inside srun, ``SLURM_NNODES``/``SLURM_NTASKS`` are the
step's values while ``SLURM_JOB_NODELIST`` is the whole allocation, so step variables come
first; ``SLURM_NTASKS_PER_NODE`` is only the ``--ntasks-per-node`` request, never the layout.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys

from clusterddp.envs.base import ClusterEnv, Placement, run_id_from
from clusterddp.errors import EnvironmentDetectionError, HostlistError
from clusterddp.hostlist import expand_hostlist
from clusterddp.validate import MAX_COUNT, MAX_NODES, MAX_VALUE_CHARS, host_problem, line_problem, shown

#: Variable names, most specific first. Step variables describe the srun step we run in;
#: job variables describe the allocation (the batch script's scope).
JOB_ID = ("SLURM_JOB_ID", "SLURM_JOBID")
ARRAY_JOB_ID = "SLURM_ARRAY_JOB_ID"
ARRAY_TASK_ID = "SLURM_ARRAY_TASK_ID"
STEP_ID = "SLURM_STEP_ID"
NODE_ID = "SLURM_NODEID"
#: The node's name as slurmd knows it (per task; absent in a 22.05 OCI container, like NODE_ID).
NODE_NAME = "SLURMD_NODENAME"
STEP_NODELIST = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
JOB_NODELIST = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
STEP_NUM_NODES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")
JOB_NUM_NODES = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"
STEP_NUM_TASKS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"
CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"
RESTART_COUNT = "SLURM_RESTART_COUNT"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
#: One entry of a tasks-per-node layout (``2``, ``2(x3)``), numbers bounded so that a hostile
#: ``1(x99999999999)`` is refused instead of expanded.
_LAYOUT_ENTRY = re.compile(r"([0-9]{1,6})(?:\(x([0-9]{1,6})\))?")


class SlurmEnv(ClusterEnv):
    """Per-node placement from SLURM's variables (see the module docstring for the modes)."""

    name = "slurm"
    looks_for = "SLURM_JOB_ID with SLURM_NODEID and SLURM_STEP_NODELIST (inside srun), or SLURM_JOB_NODELIST"

    def detected(self) -> bool:
        return self.first_var(*JOB_ID) is not None

    @property
    def in_step(self) -> bool:
        """True inside an srun step; False in the batch script or an salloc shell."""
        return self.raw_var(STEP_ID) is not None

    def placement(self) -> Placement:
        if not self.in_step:
            return self._batch_placement()
        hosts = self._hosts(STEP_NODELIST)
        nnodes = self.nodes_var(*STEP_NUM_NODES) or len(hosts)
        if hosts and len(hosts) != nnodes:
            raise EnvironmentDetectionError(
                f"slurm: {self.which(*STEP_NODELIST)} lists {len(hosts)} hosts but the step has {nnodes} nodes")
        if nnodes < 1:
            raise EnvironmentDetectionError(
                f"slurm: cannot tell how many nodes the step has: set {STEP_NUM_NODES[0]} or {STEP_NODELIST[0]}")
        node_rank = self._node_rank(hosts)
        if node_rank >= nnodes:
            raise self.error(NODE_ID, f"{node_rank} is outside 0..{nnodes - 1}")
        self._refuse_per_task(nnodes)
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank,
                         master_addr=self._master(hosts), master_port=self.port_var(MASTER_PORT),
                         nproc_per_node=self._gpus(), hosts=tuple(hosts), run_id=self._run_id(),
                         notes=self._restart_note())

    def _node_rank(self, hosts: list[str]) -> int:
        """``SLURM_NODEID``; without it (SLURM's OCI containers get no per-task variables), this
        node's index in the step's node list, found by ``SLURMD_NODENAME`` or the host name."""
        if self.raw_var(NODE_ID) is not None or not hosts:
            return self.int_var(NODE_ID, high=MAX_NODES - 1)
        name = self.host_var(NODE_NAME) or _host_name()
        for candidate in (name, name.split(".")[0]):
            if candidate in hosts:
                return hosts.index(candidate)
        raise EnvironmentDetectionError(
            f"slurm: no {NODE_ID}, and this host's name {shown(name)} is not in {self.which(*STEP_NODELIST)} "
            f"({shown(','.join(hosts[:8]))}{'...' if len(hosts) > 8 else ''})",
            "inside a container, keep the node's host name (an OCI bundle without a uts namespace), "
            f"or pass {NODE_ID} in")

    def relaunch(self, argv: list[str]) -> list[str] | None:
        """Outside a step, ``srun`` one copy of ``argv`` per node of the allocation.

        ``--ntasks`` is given with ``--nodes`` because srun reads ``SLURM_NTASKS`` from the
        batch script's environment (``sbatch --ntasks-per-node=4`` sets it to 4 x nodes),
        which would otherwise ask for several launchers per node. ``--cpus-per-task`` is
        passed on because srun (22.05 to 23.02) no longer inherits it, and the single
        launcher task must own all the CPUs its workers run on.
        """
        if self.in_step:
            return None
        nnodes = self._job_nnodes()
        if shutil.which("srun", path=self.env.get("PATH", os.defpath)) is None:
            raise EnvironmentDetectionError(
                f"slurm: {self.which(*JOB_ID)} is set outside an srun step (a batch script or salloc shell), "
                "so 'clusterddp run' relaunches itself with srun on every node, but srun is not on PATH",
                "add SLURM's bin directory to PATH in the job script, or run 'srun --ntasks-per-node=1 "
                "clusterddp run JOB' yourself")
        command = ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1",
                   "--kill-on-bad-exit=1"]
        cpus = self.first_int_var(CPUS_PER_TASK, high=MAX_COUNT)
        if cpus:
            command.append(f"--cpus-per-task={cpus}")
        return [*command, *_executable(argv)]

    def _batch_placement(self) -> Placement:
        """What the batch script sees: node 0 of the allocation, about to relaunch with srun."""
        hosts = self._hosts(JOB_NODELIST)
        nnodes = self._job_nnodes()
        note = (f"batch script (no {STEP_ID}): 'clusterddp run' relaunches itself with "
                f"'srun --ntasks-per-node=1' on all {nnodes} node(s) of the allocation")
        return Placement(env=self.name, nnodes=nnodes, node_rank=0, master_addr=self._master(hosts),
                         master_port=self.port_var(MASTER_PORT), nproc_per_node=self._gpus(),
                         hosts=tuple(hosts), run_id=self._run_id(), notes=(note, *self._restart_note()))

    def _job_nnodes(self) -> int:
        nnodes = self.nodes_var(*JOB_NUM_NODES)
        if nnodes is None:
            nnodes = len(self._hosts(JOB_NODELIST))
        if nnodes < 1:
            raise EnvironmentDetectionError(
                f"slurm: cannot tell how many nodes the allocation has: set {JOB_NUM_NODES[0]} or {JOB_NODELIST[0]}")
        return nnodes

    def _refuse_per_task(self, nnodes: int) -> None:
        """Several tasks on a node: each task is a worker already (per-task mode)."""
        layout = self.raw_var(STEP_TASKS_PER_NODE)
        if layout is not None:
            busiest = self._busiest(layout)
            where = f"{STEP_TASKS_PER_NODE}={layout if len(layout) <= 80 else shown(layout)}"
        else:
            tasks = self.first_int_var(*STEP_NUM_TASKS, high=MAX_NODES * MAX_COUNT) or nnodes
            busiest = 2 if tasks > nnodes else 1
            where = f"{self.which(*STEP_NUM_TASKS)}={tasks} for {nnodes} node(s)"
        if busiest > 1:
            raise EnvironmentDetectionError(
                f"slurm: this srun step runs several tasks per node ({where}): that is per-task mode, "
                "where every task is already a worker, and 'clusterddp run' would start workers of workers",
                "run one launcher per node ('srun --ntasks-per-node=1 clusterddp run JOB', as "
                "'clusterddp render slurm' writes it), or start the training script itself with srun "
                "and call clusterddp.train.init_distributed(), which reads SLURM_PROCID")

    def _busiest(self, layout: str) -> int:
        """The most tasks on one node of a ``2(x3),1`` layout, without expanding it."""
        entries = [_LAYOUT_ENTRY.fullmatch(part) for part in layout.split(",")]
        if len(layout) > MAX_VALUE_CHARS or not all(entries):
            raise self.error(STEP_TASKS_PER_NODE, f"invalid tasks-per-node list {shown(layout)}",
                             "expected entries like '2' or '2(x3)' separated by commas")
        if any(m is not None and m.group(2) is not None and int(m.group(2)) < 1 for m in entries):
            raise self.error(STEP_TASKS_PER_NODE, f"a repeat count is 0 in {shown(layout)}")
        return max(int(m.group(1)) for m in entries if m is not None)

    def _hosts(self, names: tuple[str, ...]) -> list[str]:
        """The nodelist, expanded; bounded text and at most ``MAX_NODES`` hosts, each a host name."""
        name = self.which(*names)
        raw = self.raw_var(name)
        if raw is None:
            return []
        problem = line_problem(raw)
        if problem is not None:
            raise self.error(name, f"{problem}: {shown(raw)}")
        try:
            hosts = expand_hostlist(raw, limit=MAX_NODES)
        except HostlistError as exc:
            raise self.error(name, str(exc)) from None
        bad = next((host for host in hosts if host_problem(host)), None)
        if bad is not None:
            raise self.error(name, f"host {shown(bad)} in {shown(raw)} is not a host name")
        return hosts

    def _master(self, hosts: list[str]) -> str | None:
        return self.host_var(MASTER_ADDR) or (hosts[0] if hosts else None)

    def _run_id(self) -> str | None:
        """The job id; an array element's own id is ``ARRAYID_TASKID`` so its port differs."""
        array_id, task_id = self.id_var(ARRAY_JOB_ID), self.id_var(ARRAY_TASK_ID)
        if array_id and task_id:
            return run_id_from(f"{array_id}_{task_id}")
        return run_id_from(self.id_var(*JOB_ID))

    def _gpus(self) -> int | None:
        return self.workers_var(GPUS_ON_NODE) or None

    def _restart_note(self) -> tuple[str, ...]:
        count = self.first_int_var(RESTART_COUNT, high=MAX_COUNT)
        return (f"requeued job: {RESTART_COUNT}={count}",) if count else ()


def _host_name() -> str:
    """This machine's host name: with no SLURM_NODEID it is how a node finds its own rank."""
    return socket.gethostname()


def _executable(argv: list[str]) -> list[str]:
    """``argv`` as a command srun can execute on every node.

    Under ``python -m clusterddp`` ``sys.argv[0]`` is the path of ``__main__.py``, which is
    not executable; it becomes this interpreter with ``-m clusterddp``.
    """
    if argv and os.path.basename(argv[0]) == "__main__.py":
        return [sys.executable, "-m", "clusterddp", *argv[1:]]
    return list(argv)
