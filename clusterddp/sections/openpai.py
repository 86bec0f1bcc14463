"""The ``openpai:`` section: what goes into the rendered protocol-v2 job (see docs/job-file.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterddp.specload import check


def _non_negative(value: int) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


@dataclass(frozen=True)
class OpenPAISpec:
    """Task role, image and resources of the OpenPAI job; never holds secrets."""

    image: str | None = None
    virtual_cluster: str = "default"
    task_role: str = "worker"
    port_label: str = "SynPort"
    cpu: int = field(default=4, metadata=check(_non_negative))
    memory_mb: int = field(default=8192, metadata=check(_non_negative))
    gpu: int | None = field(default=None, metadata=check(_non_negative))
    shm_mb: int | None = None
    task_retry_count: int = field(default=0, metadata=check(_non_negative))
    job_retry_count: int = field(default=0, metadata=check(_non_negative))
    setup: tuple[str, ...] = ()
    parameters: dict[str, str] = field(default_factory=dict)
