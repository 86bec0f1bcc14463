"""A pod of a Kubeflow TrainJob on the ``torch-distributed`` runtime (Trainer v2).

What the torch plugin (kubeflow/trainer ``pkg/runtime/framework/plugins/torch/torch.go``)
puts in the trainer container of every pod of replicated job ``node``, and nothing else
placement-wise (no MASTER_ADDR, RANK or WORLD_SIZE):

- ``PET_NNODES`` = ``numNodes``; ``PET_NODE_RANK`` = the pod's Job completion index (a
  fieldRef to its ``batch.kubernetes.io/job-completion-index`` annotation; the Job controller
  also sets ``JOB_COMPLETION_INDEX``, the same number);
- ``PET_MASTER_ADDR`` = ``<trainjob>-node-0-0.<trainjob>`` (node 0's name through the JobSet's
  headless service: it resolves only once that pod exists), ``PET_MASTER_PORT`` = 29500;
- ``PET_NPROC_PER_NODE`` = ``numProcPerNode``: a number, or ``auto`` (kept when GPUs are
  requested or ``resourcesPerNode`` is absent; with CPUs only, the plugin writes the CPU count,
  rounded up), ``gpu``, ``cpu``. A word is counted here as torchrun counts it
  (``Placement.nproc_word``): one worker per visible GPU, else one per CPU the pod was given.

Placement is ``TorchrunEnv``'s, from the same variables; this class only recognises the pod
(PET_* of a pod of an Indexed Job, no operator's RANK) so ``clusterddp env`` can say so.
Restarts belong to the runtime's JobSet (``failurePolicy``): a manifest that wants the attempt
in ``TORCHELASTIC_RESTART_COUNT`` sets ``CLUSTERDDP_RESTART_COUNT`` from the pod's
``jobset.sigs.k8s.io/restart-attempt`` label (docs/kubernetes.md, "Inside the pod").
"""

from __future__ import annotations

from dataclasses import replace

from clusterddp.envs.base import Placement
from clusterddp.envs.kubeflow import elastic_variables, is_worker
from clusterddp.envs.torchrun import TorchrunEnv

#: Set in every pod of an Indexed Job (a JobSet's, so a TrainJob's).
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
#: The torch plugin's variables that a TrainJob pod always has.
TRAINJOB_POD = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", COMPLETION_INDEX)
#: Set by a PyTorchJob's operator or an outer torchrun, never by the torch plugin.
NOT_TRAINJOB = ("MASTER_ADDR", "RANK", "GROUP_RANK", "NODE_RANK")


class TrainJobEnv(TorchrunEnv):
    name = "trainjob"
    looks_for = "PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and JOB_COMPLETION_INDEX, no RANK (TrainJob pod)"

    def detected(self) -> bool:
        if is_worker(self.env) or elastic_variables(self.env):
            return False
        return (all(self.raw_var(name) for name in TRAINJOB_POD)
                and not any(self.raw_var(name) for name in NOT_TRAINJOB))

    def placement(self) -> Placement:
        placed = super().placement()
        workers = (f"PET_NPROC_PER_NODE={placed.nproc_word}: counted here as torchrun does"
                   if placed.nproc_word else f"workers per node = PET_NPROC_PER_NODE = {placed.nproc_per_node}"
                   if placed.nproc_per_node else "workers per node from the job file")
        note = (f"Kubeflow TrainJob pod (torch-distributed runtime): node rank = PET_NODE_RANK = "
                f"{placed.node_rank}, nodes = PET_NNODES = {placed.nnodes}, master = PET_MASTER_ADDR; {workers}")
        return replace(placed, notes=placed.notes + (note,))
