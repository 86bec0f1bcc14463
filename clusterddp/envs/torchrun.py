"""An outer launcher already placed this node: torchrun-style variables are set.

Covers a clusterddp run started by torchrun's agent environment, Kubeflow PyTorchJob
(``PET_*``), and any wrapper that exports GROUP_RANK/NODE_RANK + MASTER_ADDR. It comes
before the schedulers: such a wrapper can itself run inside a SLURM allocation, and its
choice of master is the one the other nodes use.

An environment that asks for an elastic rendezvous (``PET_RDZV_*``, ``PET_NNODES=1:4``) is not
placed here unless an agent already placed it (a worker's ``GROUP_RANK``, ``LOCAL_RANK``): ``KubeflowEnv`` refuses it.
"""

from __future__ import annotations

from clusterddp.envs.base import ClusterEnv, Placement, run_id_from
from clusterddp.envs.kubeflow import PET_NNODES, elastic_variables, is_worker, pet_nnodes
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.validate import MAX_COUNT, MAX_NODES

NODE_RANK = ("GROUP_RANK", "NODE_RANK", "PET_NODE_RANK")
NNODES = ("GROUP_WORLD_SIZE", "NNODES", PET_NNODES)
MASTER_ADDR = ("MASTER_ADDR", "PET_MASTER_ADDR")
MASTER_PORT = ("MASTER_PORT", "PET_MASTER_PORT")
NPROC = ("LOCAL_WORLD_SIZE", "PET_NPROC_PER_NODE")
#: torchrun's nproc words: the job file decides how many workers then.
NPROC_WORDS = ("auto", "gpu", "cpu")
RUN_ID = ("TORCHELASTIC_RUN_ID", "PET_RDZV_ID")
#: A PyTorchJob pod of an operator since kubeflow/training-operator#1840: v1's four and PET_*.
PYTORCHJOB_POD = ("MASTER_ADDR", "RANK", "WORLD_SIZE", "PET_NODE_RANK", "PET_NNODES")


class TorchrunEnv(ClusterEnv):
    name = "torchrun"
    looks_for = "MASTER_ADDR with GROUP_RANK or NODE_RANK (or PET_MASTER_ADDR, PET_NODE_RANK)"

    def detected(self) -> bool:
        if self.first_var(*MASTER_ADDR) is None or self.first_var(*NODE_RANK) is None:
            return False
        # A worker's agent (GROUP_RANK, LOCAL_RANK...) made the placement already; otherwise
        # rendezvous variables mean the ranks are not fixed yet (KubeflowEnv refuses that).
        return is_worker(self.env) or not elastic_variables(self.env)

    def placement(self) -> Placement:
        node_rank = self.first_int_var(*NODE_RANK, high=MAX_NODES - 1)
        assert node_rank is not None  # detected() guarantees it
        nproc = self._nproc()
        nnodes = self._nnodes(nproc)
        if node_rank >= nnodes:
            raise self.error(self.which(*NODE_RANK), f"node rank {node_rank} is outside 0..{nnodes - 1}")
        word = self.raw_var(self.which(*NPROC))
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank,
                         master_addr=self.host_var(*MASTER_ADDR), master_port=self.port_var(*MASTER_PORT),
                         nproc_per_node=nproc, nproc_word=word if word in NPROC_WORDS else None,
                         run_id=run_id_from(self.id_var(*RUN_ID)), notes=self._pod_notes(node_rank, nnodes))

    def _pod_notes(self, node_rank: int, nnodes: int) -> tuple[str, ...]:
        """Says so when this is a PyTorchJob pod of a training operator with PET_* (its RANK and
        WORLD_SIZE count pods x nprocPerNode, so PET_NODE_RANK and PET_NNODES place it)."""
        if is_worker(self.env) or not all(self.raw_var(name) for name in PYTORCHJOB_POD):
            return ()
        return (f"Kubeflow PyTorchJob pod (PET_* from the training operator): one launcher per pod, "
                f"node rank = PET_NODE_RANK = {node_rank}, nodes = PET_NNODES = {nnodes}; "
                f"the master pod is node 0",)

    def _nnodes(self, nproc: int | None) -> int:
        """GROUP_WORLD_SIZE (or NNODES, PET_NNODES), else WORLD_SIZE / LOCAL_WORLD_SIZE."""
        name = self.which(*NNODES)
        if self.raw_var(name) is not None:
            return pet_nnodes(self, name) if name == PET_NNODES else self.int_var(name, low=1)
        world = self.first_int_var("WORLD_SIZE", low=1, high=MAX_NODES * MAX_COUNT)
        if world is None or not nproc:
            raise EnvironmentDetectionError(
                "torchrun: node rank is set but not the number of nodes: set GROUP_WORLD_SIZE "
                "(or NNODES / PET_NNODES), or WORLD_SIZE with LOCAL_WORLD_SIZE")
        if world % nproc or world // nproc > MAX_NODES:
            raise self.error("WORLD_SIZE", f"{world} workers are not whole nodes of {nproc} "
                                           f"(LOCAL_WORLD_SIZE) within {MAX_NODES} nodes")
        return world // nproc

    def _nproc(self) -> int | None:
        name = self.which(*NPROC)
        raw = self.raw_var(name)
        if raw in NPROC_WORDS:  # PET_NPROC_PER_NODE may say 'auto' or 'gpu': then the job decides
            return None
        # 1 or more: a 0 is refused, not quietly replaced by the job file's count (SLURM's
        # GPUS_ON_NODE=0 means "no GPUs here"; a torchrun count of 0 means a broken pod spec).
        return self.workers_var(name, low=1)
