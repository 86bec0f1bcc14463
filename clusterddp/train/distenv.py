"""Where this process sits in the job, read from the environment, without torch.

Three contracts are understood, tried in this order:

1. torchrun and the clusterddp launcher: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
   ``MASTER_ADDR``, ``MASTER_PORT``. First, because both can run inside a SLURM
   allocation, where the SLURM variables describe the launcher's task, not the worker.
   The deprecated ``torch.distributed.launch`` sets the same variables except
   ``LOCAL_RANK``, which it passes as ``--local_rank=N`` / ``--local-rank=N``; that
   argument fills the gap.
2. SLURM per-task mode (``srun python train.py``, one task per GPU): ``SLURM_PROCID``,
   ``SLURM_LOCALID``, ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``; the master is the first
   host of the step's nodelist. Only inside an srun step (``SLURM_STEP_ID`` set): the
   batch script itself also has ``SLURM_PROCID=0`` and the allocation's ``SLURM_NTASKS``,
   and treating it as rank 0 of N would wait forever for N-1 peers that never start.
3. Nothing: a single process.

The function is pure (a mapping and an argv in, a dataclass out) so it is tested with
plain dicts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

#: torchrun's names, which the clusterddp launcher emits as well.
TORCHRUN_VARS = {
    "rank": "RANK",
    "world_size": "WORLD_SIZE",
    "local_rank": "LOCAL_RANK",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
}

#: SLURM's names in per-task mode (srun.1). Step variables first: inside srun they describe
#: the step, while the job-level ones may describe the whole allocation.
SLURM_VARS: dict[str, Any] = {  # a name, or the names to try in order
    "rank": "SLURM_PROCID",
    "local_rank": "SLURM_LOCALID",
    "node_rank": "SLURM_NODEID",
    "world_size": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    "nodelist": ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "job_id": "SLURM_JOB_ID",
    "in_step": "SLURM_STEP_ID",
}

#: Per-task SLURM jobs have no launcher to pick a port; every task derives the same one from
#: the job id (Lightning's convention), unless MASTER_PORT is set.
SLURM_PORT_BASE = 15000
SLURM_DEFAULT_PORT = 12910

_LOCAL_RANK_ARG = re.compile(r"^--local[_-]rank(?:=(\d+))?$")


class DistEnvError(ValueError):
    """The environment says "distributed" but is incomplete or contradicts itself."""


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, as the environment describes it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # "torchrun", "torch.distributed.launch", "slurm" or "single"

    @property
    def distributed(self) -> bool:
        """A world of one needs no process group: every collective is the identity."""
        return self.world_size > 1


SINGLE = DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1,
                 master_addr="127.0.0.1", master_port=0, source="single")


def local_rank_from_argv(argv: Sequence[str]) -> int | None:
    """The value of ``--local_rank N``, ``--local_rank=N`` or ``--local-rank=N``, if any."""
    for i, arg in enumerate(argv):
        match = _LOCAL_RANK_ARG.match(arg)
        if not match:
            continue
        value = match.group(1)
        if value is None and i + 1 < len(argv) and argv[i + 1].isdigit():
            value = argv[i + 1]
        if value is None:
            raise DistEnvError(f"{arg} needs an integer value")
        return int(value)
    return None


def read_dist_env(env: Mapping[str, str], argv: Sequence[str] = (),
                  expand_hostlist: Callable[[str], list[str]] | None = None) -> DistEnv:
    """Read the distributed contract from ``env`` (and ``argv`` for ``--local_rank``).

    ``expand_hostlist`` turns a SLURM nodelist into host names; it is only called in
    SLURM per-task mode without ``MASTER_ADDR``, and defaults to
    ``clusterddp.hostlist.expand_hostlist``.
    """
    if "RANK" in env and "WORLD_SIZE" in env:
        return _from_torchrun(env, argv)
    if "SLURM_PROCID" in env and SLURM_VARS["in_step"] in env:
        return _from_slurm(env, expand_hostlist)
    arg_rank = local_rank_from_argv(argv)
    if arg_rank is not None:
        raise DistEnvError(
            f"--local_rank={arg_rank} was given but RANK and WORLD_SIZE are not set; "
            "torch.distributed.launch sets both, so this process was not started by it")
    return SINGLE


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw)
    except ValueError:
        raise DistEnvError(f"{name}={raw!r} is not an integer") from None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if env.get(name):
            return env[name]
    return None


def _check(rank: int, local_rank: int, world_size: int, local_world_size: int, how: str) -> None:
    if world_size < 1:
        raise DistEnvError(f"{how}: world size {world_size} must be at least 1")
    if not 0 <= rank < world_size:
        raise DistEnvError(f"{how}: rank {rank} is outside 0..{world_size - 1}")
    if not 0 <= local_rank < local_world_size:
        raise DistEnvError(f"{how}: local rank {local_rank} is outside 0..{local_world_size - 1}")


def _from_torchrun(env: Mapping[str, str], argv: Sequence[str]) -> DistEnv:
    rank = _int(env, "RANK")
    world_size = _int(env, "WORLD_SIZE")
    source = "torchrun"
    if "LOCAL_RANK" in env:
        local_rank = _int(env, "LOCAL_RANK")
    else:
        arg_rank = local_rank_from_argv(argv)
        if arg_rank is None:
            # One process per node, or a hand-made env: the global rank is the only hint.
            arg_rank = rank if world_size == 1 else 0
        else:
            source = "torch.distributed.launch"
        local_rank = arg_rank
    local_world_size = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env \
        else max(local_rank + 1, 1)
    _check(rank, local_rank, world_size, local_world_size, source)
    if world_size > 1:
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not env.get(n)]
        if missing:
            raise DistEnvError(f"{source}: RANK and WORLD_SIZE are set but {' and '.join(missing)} "
                               "is not; every rank needs the same rendezvous address")
    port = _int(env, "MASTER_PORT") if env.get("MASTER_PORT") else 0
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank,
                   local_world_size=local_world_size,
                   master_addr=env.get("MASTER_ADDR") or "127.0.0.1", master_port=port,
                   source=source)


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's task-count list: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise DistEnvError(f"cannot read tasks per node {text!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def slurm_master_port(env: Mapping[str, str]) -> int:
    """``MASTER_PORT`` if set, else 15000 + the last four digits of the job id."""
    if env.get("MASTER_PORT"):
        return _int(env, "MASTER_PORT")
    job_id = env.get(SLURM_VARS["job_id"], "")
    digits = re.sub(r"\D", "", job_id)
    if not digits:
        return SLURM_DEFAULT_PORT
    return SLURM_PORT_BASE + int(digits[-4:])


def _from_slurm(env: Mapping[str, str], expand_hostlist: Callable[[str], list[str]] | None) -> DistEnv:
    rank = _int(env, SLURM_VARS["rank"])
    local_rank = _int(env, SLURM_VARS["local_rank"]) if SLURM_VARS["local_rank"] in env else 0
    world_raw = _first(env, SLURM_VARS["world_size"])
    if world_raw is None:
        raise DistEnvError("slurm: SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS "
                           "nor SLURM_NTASKS is")
    try:
        world_size = int(world_raw)
    except ValueError:
        raise DistEnvError(f"slurm: task count {world_raw!r} is not an integer") from None
    local_world_size = local_rank + 1
    per_node = _first(env, SLURM_VARS["tasks_per_node"])
    if per_node:
        counts = expand_tasks_per_node(per_node)
        node = int(env.get(SLURM_VARS["node_rank"], "0") or 0)
        if 0 <= node < len(counts):
            local_world_size = counts[node]
    _check(rank, local_rank, world_size, local_world_size, "slurm")
    master_addr = env.get("MASTER_ADDR")
    if not master_addr:
        nodelist = _first(env, SLURM_VARS["nodelist"])
        if nodelist is None:
            raise DistEnvError("slurm: no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST to find "
                               "the master host in, and MASTER_ADDR is not set")
        if expand_hostlist is None:
            from clusterddp import hostlist  # torch-free, SLURM syntax
            expand_hostlist = hostlist.expand_hostlist
        hosts = expand_hostlist(nodelist)
        if not hosts:
            raise DistEnvError(f"slurm: nodelist {nodelist!r} names no hosts")
        master_addr = hosts[0]
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank,
                   local_world_size=local_world_size, master_addr=master_addr,
                   master_port=slurm_master_port(env), source="slurm")
