"""Cluster environment detection: the order lives here and only here.

Adding a scheduler means one module in this package and one line in ``ORDER``.
"""

from __future__ import annotations

import importlib
from typing import Iterator, Mapping

from clusterddp.envs.base import ClusterEnv, Overrides, Placement

#: Tried first to last; the first whose ``detected()`` is true gives the placement.
ORDER: tuple[str, ...] = (
    # Explicit CLI flags first: the SSH head and a user starting nodes by hand mean exactly
    # what they typed, even inside an allocation.
    "clusterddp.envs.explicit:ExplicitEnv",
    # A Kubeflow TrainJob pod: the torch plugin's PET_* in a pod of an Indexed Job, no operator
    # RANK. Placed as torchrun's variables say; before TorchrunEnv only to be named as such.
    "clusterddp.envs.trainjob:TrainJobEnv",
    # An outer launcher (torchrun, Kubeflow) already placed us; it may itself run under SLURM.
    "clusterddp.envs.torchrun:TorchrunEnv",
    # Kubeflow pods torchrun's variables do not place: a v1 pod without PET_* (RANK and
    # WORLD_SIZE without an agent's LOCAL_RANK/GROUP_RANK), placed one launcher per pod; an
    # elastic pod (PET_RDZV_*, PET_NNODES=min:max), refused. Before the schedulers: a pod is in
    # no allocation, and an elastic pod must never quietly train alone.
    "clusterddp.envs.kubeflow:KubeflowEnv",
    # A JobSet pod: the renderer's CLUSTERDDP_JOBSET_* and the Job's JOB_COMPLETION_INDEX. After
    # the agents' variables (a worker inherits the pod's env), before the schedulers (a pod is
    # in no allocation).
    "clusterddp.envs.jobset:JobSetEnv",
    # OpenPAI: its task-index variables exist only inside an OpenPAI task (a k8s pod, never under SLURM).
    "clusterddp.envs.openpai:OpenPAIEnv",
    # SLURM: per-node launcher inside srun, or the batch script (which relaunches with srun).
    "clusterddp.envs.slurm:SlurmEnv",
    # MPI after SLURM: srun with PMI also sets PMI_RANK, and SLURM's own variables say more.
    "clusterddp.envs.mpi:MPIEnv",
    # Last: one machine, loopback master. Always matches.
    "clusterddp.envs.local:LocalEnv",
)


def environment_classes() -> Iterator[type[ClusterEnv]]:
    """The environment classes in detection order, each imported only when reached: a
    launcher placed by explicit flags (every host of an SSH fan-out) imports no scheduler."""
    for entry in ORDER:
        module_name, _, class_name = entry.partition(":")
        yield getattr(importlib.import_module(module_name), class_name)


def detect(env: Mapping[str, str], overrides: Overrides | None = None) -> ClusterEnv:
    """The first environment in ``ORDER`` that recognises ``env``."""
    overrides = overrides or Overrides()
    for cls in environment_classes():
        candidate = cls(env, overrides)
        if candidate.detected():
            return candidate
    raise AssertionError("unreachable: LocalEnv always matches")


def known_environments() -> str:
    """One line per environment and what it looks for, for ``clusterddp env`` and errors."""
    return "\n".join(f"  {cls.name:10s} {cls.looks_for}" for cls in environment_classes())


__all__ = ["ClusterEnv", "Overrides", "Placement", "ORDER", "detect", "known_environments"]
