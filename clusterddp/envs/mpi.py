"""One launcher per node started by MPI (``mpirun --map-by ppr:1:node clusterddp run JOB``).

Open MPI (``OMPI_COMM_WORLD_*``) and MPICH/Intel MPI (``PMI_RANK``/``PMI_SIZE``) name the
process, not the node, and give no master address: with one launcher per node, the MPI rank
is the node rank, and MASTER_ADDR must be exported by the user (``mpirun -x MASTER_ADDR=...``),
as mmengine and DeepSpeed also require.
"""

from __future__ import annotations

from clusterddp.envs.base import ClusterEnv, Placement
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.validate import MAX_COUNT, MAX_NODES

RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")
SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


class MPIEnv(ClusterEnv):
    name = "mpi"
    looks_for = "OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE, one launcher per node, plus MASTER_ADDR"

    def detected(self) -> bool:
        return self.first_var(*RANK) is not None and self.first_var(*SIZE) is not None

    def placement(self) -> Placement:
        nnodes = self.nodes_var(*SIZE)
        node_rank = self.first_int_var(*RANK, high=MAX_NODES - 1)
        assert node_rank is not None and nnodes is not None  # detected() guarantees them
        if node_rank >= nnodes:
            raise self.error(self.which(*RANK), f"MPI rank {node_rank} is outside 0..{nnodes - 1}")
        local = self.first_int_var(*LOCAL_SIZE, high=MAX_COUNT)
        if local is not None and local > 1:
            raise EnvironmentDetectionError(
                f"mpi: {local} MPI processes on this node; clusterddp needs one launcher per node",
                "start it with 'mpirun --map-by ppr:1:node clusterddp run JOB' (or -npernode 1)")
        addr = self.host_var("MASTER_ADDR")
        if addr is None and nnodes > 1:
            raise EnvironmentDetectionError("mpi: MASTER_ADDR is not set and MPI gives no master address",
                                            "export it to every node: mpirun -x MASTER_ADDR=<first host> ...")
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank, master_addr=addr or "127.0.0.1",
                         master_port=self.port_var("MASTER_PORT"), run_id=self.overrides.run_id)
