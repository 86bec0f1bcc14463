"""An outer launcher already placed this node: torchrun-style variables are set.

Covers a clusterddp run started by torchrun's agent environment, Kubeflow PyTorchJob
(``PET_*``), and any wrapper that exports GROUP_RANK/NODE_RANK + MASTER_ADDR. It comes
before the schedulers: such a wrapper can itself run inside a SLURM allocation, and its
choice of master is the one the other nodes use.
"""

from __future__ import annotations

from clusterddp.envs.base import ClusterEnv, Placement
from clusterddp.errors import EnvironmentDetectionError

NODE_RANK = ("GROUP_RANK", "NODE_RANK", "PET_NODE_RANK")
NNODES = ("GROUP_WORLD_SIZE", "NNODES", "PET_NNODES")
MASTER_ADDR = ("MASTER_ADDR", "PET_MASTER_ADDR")
MASTER_PORT = ("MASTER_PORT", "PET_MASTER_PORT")
NPROC = ("LOCAL_WORLD_SIZE", "PET_NPROC_PER_NODE")
RUN_ID = ("TORCHELASTIC_RUN_ID", "PET_RDZV_ID")


class TorchrunEnv(ClusterEnv):
    name = "torchrun"
    looks_for = "MASTER_ADDR with GROUP_RANK or NODE_RANK (or PET_MASTER_ADDR, PET_NODE_RANK)"

    def detected(self) -> bool:
        return self.first_var(*MASTER_ADDR) is not None and self.first_var(*NODE_RANK) is not None

    def placement(self) -> Placement:
        node_rank = self.first_int_var(*NODE_RANK)
        assert node_rank is not None  # detected() guarantees it
        nnodes = self.first_int_var(*NNODES)
        nproc = self._nproc()
        if nnodes is None:
            world = self.first_int_var("WORLD_SIZE")
            if world is None or not nproc:
                raise EnvironmentDetectionError(
                    "torchrun: node rank is set but not the number of nodes: set GROUP_WORLD_SIZE "
                    "(or NNODES / PET_NNODES), or WORLD_SIZE with LOCAL_WORLD_SIZE")
            nnodes = world // nproc
        if not 0 <= node_rank < nnodes:
            raise EnvironmentDetectionError(f"torchrun: node rank {node_rank} is outside 0..{nnodes - 1}")
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank,
                         master_addr=self.first_var(*MASTER_ADDR),
                         master_port=self.first_int_var(*MASTER_PORT),
                         nproc_per_node=nproc, run_id=self.first_var(*RUN_ID))

    def _nproc(self) -> int | None:
        for name in NPROC:
            raw = self.env.get(name, "").strip()
            if raw.isdigit():  # PET_NPROC_PER_NODE may say 'auto' or 'gpu': then the job decides
                return int(raw)
        return None
