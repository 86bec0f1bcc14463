"""Placement given on the command line (``--nnodes --node-rank --master-addr --master-port``).

This is how the SSH head starts the launcher on each host, and how a user starts one node
of a bare cluster by hand. It wins over everything the environment says.
"""

from __future__ import annotations

from clusterddp.envs.base import ClusterEnv, Placement
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.validate import MAX_NODES, host_problem


class ExplicitEnv(ClusterEnv):
    name = "explicit"
    looks_for = "--node-rank or --master-addr, with --nnodes (or CLUSTERDDP_NODE_RANK, ...)"

    def detected(self) -> bool:
        return self.overrides.any_given

    def placement(self) -> Placement:
        nnodes = self.overrides.nnodes or 1
        node_rank = self.overrides.node_rank or 0
        if not 1 <= nnodes <= MAX_NODES:
            raise EnvironmentDetectionError(f"--nnodes: expected 1 to {MAX_NODES} nodes, got {nnodes}")
        if not 0 <= node_rank < nnodes:
            raise EnvironmentDetectionError(
                f"--node-rank {node_rank} is outside 0..{nnodes - 1} (--nnodes {nnodes})")
        addr = self.overrides.master_addr
        if addr is not None and host_problem(addr) is not None:
            raise EnvironmentDetectionError(f"--master-addr: {host_problem(addr)}")
        if addr is None and nnodes == 1:
            addr = "127.0.0.1"
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank, master_addr=addr,
                         master_port=self.overrides.master_port, run_id=self.overrides.run_id)
