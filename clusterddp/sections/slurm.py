"""The ``slurm:`` section: what goes into the rendered sbatch script (see docs/job-file.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterddp.specload import check


def _positive(value: int) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


@dataclass(frozen=True)
class SlurmSpec:
    """sbatch options; ``nodes`` comes from the job's top-level ``nodes``."""

    partition: str | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = field(default=None, metadata=check(_positive))
    mem: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    output: str | None = None
    error: str | None = None
    requeue: bool = True
    signal: str = "B:USR1@90"
    extra_sbatch: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
