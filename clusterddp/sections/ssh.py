"""The ``ssh:`` section: how the head reaches bare hosts (see docs/job-file.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterddp.specload import check


def _port(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"port must be 1-65535, got {value}"


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


@dataclass(frozen=True)
class SSHSpec:
    """Hosts and connection settings for SSH fan-out."""

    hosts: tuple[str, ...] = ()
    hostfile: str | None = None
    user: str | None = None
    port: int = field(default=22, metadata=check(_port))
    identity_file: str | None = None
    config_file: str | None = None
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    connect_timeout: float = field(default=10.0, metadata=check(_positive))
    env_allow: tuple[str, ...] = ()
    interface: str | None = None
