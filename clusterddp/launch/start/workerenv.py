"""The one writer of a worker's environment: every variable a worker gets, in one dict.

torch elastic builds a worker's environment in one dict in one function
(``LocalElasticAgent._start_workers``); so does ``WorkerEnv.build``. ``plan.worker_plans``
gathers its inputs once, the supervisor passes the attempt number through, the worker group
hands the dict to exec untouched, and ``--dry-run`` prints what ``build`` returns for the
first start. A variable written anywhere else would be one the dry run does not show, or one
a restart gets wrong (TORCHELASTIC_RESTART_COUNT had two writers).

Order of precedence, later wins (README, "What each worker gets"): the launcher's environment,
the defaults, the job's ``env:``, then the contract. What reaches a worker through the
launcher's environment, and is written by no code of the launcher: ``env_passthrough``'s
variables (checked to be set, never copied), the zipapp's PYTHONPATH (its ``__main__`` puts the
archive there before the CLI runs: clusterddp/pack.py), a scheduler's variables such as a
JobSet pod's CLUSTERDDP_RESTART_COUNT (read as ``--restart-count``: it becomes the attempt
number here). CPU affinity is no variable (``procs.spawn`` binds the process); it only sets
the default OMP_NUM_THREADS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from clusterddp.protocol import BACKEND_ENV, HEARTBEAT_FILE_ENV, STACKS_FILE_ENV, STOP_SIGNALS, SUPERVISOR_ID_ENV
from clusterddp.topology import Topology


@dataclass(frozen=True)
class WorkerEnv:
    """What one worker's environment is made of; ``build`` writes it."""

    topology: Topology
    local_rank: int
    #: The launcher's environment, which the worker inherits.
    launcher: Mapping[str, str] = field(default_factory=dict)
    #: The job's ``env:``.
    job: Mapping[str, str] = field(default_factory=dict)
    #: TORCHELASTIC_MAX_RESTARTS: the job's ``restarts``.
    max_restarts: int = 0
    #: OMP_NUM_THREADS unless the launcher's environment sets it: cores / workers, or the
    #: number of the worker's own CPUs when it is bound to some.
    threads: int = 1
    #: This rank's files in the run's log directory (None: not set, as for a bare contract).
    error_file: str | None = None
    stacks_file: str | None = None
    heartbeat_file: str | None = None
    #: ``virtual_local_rank``: the worker's one GPU (its CUDA_VISIBLE_DEVICES entry), which it
    #: sees as device 0.
    device: str | None = None

    def build(self, attempt: int, marker: str | None = None) -> dict[str, str]:
        """The worker's environment on its ``attempt``-th start (TORCHELASTIC_RESTART_COUNT:
        the job's restarts from outside, ``--restart-count``, plus this launcher's own).

        ``marker``: the launcher's token (SUPERVISOR_ID_ENV) by which its reaper finds the
        worker's descendants; None in a dry run, where no launcher supervises anything.
        Steps of the contract: rank = first rank of this node + local_rank; the worker group
        is this node, so GROUP_RANK = node_rank and GROUP_WORLD_SIZE = nnodes; there is one
        role ('default', as torchrun), so ROLE_RANK = RANK and ROLE_WORLD_SIZE = WORLD_SIZE.
        """
        topology = self.topology
        if not 0 <= self.local_rank < topology.nproc_per_node:
            raise ValueError(f"local_rank {self.local_rank} outside 0..{topology.nproc_per_node - 1}")
        rank = str(topology.global_rank(self.local_rank))
        env = dict(self.launcher)
        # This launcher's files win over a launcher's own (a launcher run by a worker); the
        # job's env: may still move them.
        if self.stacks_file is not None:
            env[STACKS_FILE_ENV] = self.stacks_file
        if self.heartbeat_file is not None:
            env[HEARTBEAT_FILE_ENV] = self.heartbeat_file
        env.setdefault("OMP_NUM_THREADS", str(self.threads))  # torchrun uses 1
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # as torchrun: a dead peer raises, not hangs
        env.update(self.job)
        env.update({
            "RANK": rank,
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(topology.world_size),
            "LOCAL_WORLD_SIZE": str(topology.nproc_per_node),
            "GROUP_RANK": str(topology.node_rank),
            "GROUP_WORLD_SIZE": str(topology.nnodes),
            "ROLE_RANK": rank,
            "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": str(topology.world_size),
            "MASTER_ADDR": topology.master_addr,
            "MASTER_PORT": str(topology.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
            "TORCHELASTIC_RUN_ID": topology.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(sig.name for sig in STOP_SIGNALS),
            "NODE_RANK": str(topology.node_rank),
            BACKEND_ENV: topology.backend,
        })
        if self.error_file is not None:
            env["TORCHELASTIC_ERROR_FILE"] = self.error_file
        if self.device is not None:
            env.update(LOCAL_RANK="0", CUDA_VISIBLE_DEVICES=self.device)
        if marker is not None:
            env[SUPERVISOR_ID_ENV] = marker
        return env
