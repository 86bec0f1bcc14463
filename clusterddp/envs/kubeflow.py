"""Kubeflow PyTorchJob pods that torchrun's variables do not place, and elastic pods (refused).

What the training-operator (v1, ``pkg/controller.v1/pytorch/envvar.go``, ``master.go``,
``elastic.go``) sets in every container:

- With a Master replica: ``MASTER_ADDR`` (``<job>-master-0``), ``MASTER_PORT``, ``RANK`` (the
  pod's index: master 0, worker i is i+1) and ``WORLD_SIZE``. Since #1840 (2023-07) also
  ``PET_MASTER_ADDR/PORT``, ``PET_NODE_RANK`` = RANK and ``PET_NNODES``: those pods are placed
  by ``TorchrunEnv``. Before it there is no ``PET_*`` and ``WORLD_SIZE`` is the number of pods;
  this module places those: one launcher per pod, node rank = RANK, nodes = WORLD_SIZE.
- With an ``elasticPolicy``: ``PET_RDZV_ENDPOINT``, ``PET_RDZV_BACKEND`` (default c10d),
  ``PET_NNODES`` (``min:max``) and no node rank: torchrun's agents meet at a rendezvous server
  and are given their ranks there. clusterddp has no rendezvous server, so it refuses in one
  line rather than let every pod train alone.

A worker started by torchrun or clusterddp also has RANK, WORLD_SIZE and MASTER_ADDR, and
inherits the pod's ``PET_*``; it is recognised by the agent's own variables (``LOCAL_RANK``,
``GROUP_RANK`` ...) and left to ``TorchrunEnv``, as before.
"""

from __future__ import annotations

from typing import Mapping

from clusterddp.envs.base import ClusterEnv, Placement
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.validate import MAX_NODES, int_text_problem, shown

MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
#: A v1 pod without PET_*: all four are set (only with a Master replica).
V1_POD = (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
#: Set by an agent (torchrun, clusterddp) in each worker it starts, never by the operator.
WORKER_MARKERS = ("LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
#: Another scheduler's own variables: a batch script that exports RANK and WORLD_SIZE (often a
#: process count) is placed by that scheduler, as before, never as a Kubeflow pod.
OTHER_SCHEDULERS = ("SLURM_JOB_ID", "SLURM_JOBID", "PAI_TASK_INDEX", "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX",
                    "OMPI_COMM_WORLD_RANK", "PMI_RANK")
PET_NNODES = "PET_NNODES"
RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
RDZV_BACKEND = "PET_RDZV_BACKEND"


def _set(env: Mapping[str, str], name: str) -> bool:
    return bool(env.get(name))


def is_worker(env: Mapping[str, str]) -> bool:
    """True in a process an agent (torchrun, clusterddp) started as a worker."""
    return any(_set(env, name) for name in WORKER_MARKERS)


def node_range(raw: str) -> tuple[str, str]:
    """``PET_NNODES`` as torchrun reads it: ``"N"`` or ``"MIN:MAX"`` (texts, unchecked)."""
    low, sep, high = raw.partition(":")
    return (low, high) if sep else (raw, raw)


def elastic_variables(env: Mapping[str, str]) -> list[str]:
    """The variables asking for an elastic rendezvous: a rendezvous endpoint, a backend other
    than 'static', or a node range whose bounds differ. Empty when there is none."""
    found = [name for name in (RDZV_ENDPOINT,) if _set(env, name)]
    if _set(env, RDZV_BACKEND) and env[RDZV_BACKEND] != "static":
        found.append(RDZV_BACKEND)
    if _set(env, PET_NNODES) and len(set(node_range(env[PET_NNODES]))) > 1:
        found.insert(0, PET_NNODES)
    return found


def elastic_error(env: Mapping[str, str], names: list[str]) -> EnvironmentDetectionError:
    shown_vars = ", ".join(f"{name}={shown(env[name], 40)}" for name in names)
    return EnvironmentDetectionError(
        f"kubeflow: {shown_vars}: this pod asks for an elastic rendezvous (ranks given out by a "
        "rendezvous server), and clusterddp has no rendezvous server",
        "run torchrun in these pods (it reads PET_*), or give a fixed node count: a PyTorchJob with a "
        "Master replica and no elasticPolicy, or --nnodes/--node-rank/--master-addr")


class KubeflowEnv(ClusterEnv):
    """A PyTorchJob v1 pod without PET_* (placed), or an elastic pod (refused)."""

    name = "kubeflow"
    looks_for = ("MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE without LOCAL_RANK (PyTorchJob v1 pod); "
                 "PET_RDZV_*/PET_NNODES=min:max are refused")

    def detected(self) -> bool:
        if is_worker(self.env):
            return False
        if elastic_variables(self.env) or _set(self.env, PET_NNODES):
            return True
        others = any(_set(self.env, name) for name in OTHER_SCHEDULERS)
        return not others and all(_set(self.env, name) for name in V1_POD)

    def placement(self) -> Placement:
        elastic = elastic_variables(self.env)
        if elastic:
            raise elastic_error(self.env, elastic)
        if all(_set(self.env, name) for name in V1_POD):
            return self._v1_pod()
        nnodes = self._pet_nnodes()
        if nnodes != 1:
            raise self.error(PET_NNODES, f"{nnodes} nodes, but this pod has no node rank and no master",
                             "set PET_NODE_RANK and PET_MASTER_ADDR (or MASTER_ADDR), or run torchrun here")
        return Placement(env=self.name, nnodes=1, node_rank=0, master_addr="127.0.0.1",
                         master_port=self.port_var(MASTER_PORT, "PET_MASTER_PORT"), run_id=self.overrides.run_id)

    def _v1_pod(self) -> Placement:
        nnodes = self.int_var(WORLD_SIZE, low=1, high=MAX_NODES)
        node_rank = self.int_var(RANK, low=0, high=MAX_NODES - 1)
        if node_rank >= nnodes:
            raise self.error(RANK, f"pod rank {node_rank} is outside 0..{nnodes - 1} (WORLD_SIZE={nnodes})")
        note = (f"Kubeflow PyTorchJob v1 pod (RANK, WORLD_SIZE without LOCAL_RANK): one launcher per pod, "
                f"node rank = RANK = {node_rank}, nodes = WORLD_SIZE = {nnodes}; the master pod is RANK 0")
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank, master_addr=self.host_var(MASTER_ADDR),
                         master_port=self.port_var(MASTER_PORT), run_id=self.overrides.run_id, notes=(note,))

    def _pet_nnodes(self) -> int:
        return pet_nnodes(self, PET_NNODES)


def pet_nnodes(env: ClusterEnv, name: str) -> int:
    """``PET_NNODES`` as a fixed node count: ``"N"`` or ``"N:N"``; a range is elastic."""
    raw = env.env[name]
    low, high = node_range(raw)
    if low != high:
        raise elastic_error(env.env, [name])
    problem = int_text_problem(low, 1, MAX_NODES)
    if problem is not None:
        raise env.error(name, problem if low == raw else f"{problem} (in {shown(raw)})")
    return int(low)
