"""One machine, nothing else detected: master on loopback, a free port."""

from __future__ import annotations

from clusterddp.envs.base import ClusterEnv, Placement


class LocalEnv(ClusterEnv):
    name = "local"
    looks_for = "nothing (always matches)"

    def detected(self) -> bool:
        return True

    def placement(self) -> Placement:
        return Placement(env=self.name, nnodes=1, node_rank=0, master_addr="127.0.0.1",
                         master_port=None, run_id=self.overrides.run_id)
