"""The ``ssh:`` section: how the head reaches bare hosts (docs/ssh.md explains each key).

Connection settings left out here come from the ssh_config file (``config_file``, else
``~/.ssh/config``) as OpenSSH would read them: values written in the job win, like options on
the ``ssh`` command line win over the config file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clusterddp.specload import check


def _port(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"port must be 1-65535, got {value}"


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def _env_patterns(value: tuple[str, ...]) -> str | None:
    for pattern in value:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\*?$", pattern):
            return f"expected variable names or prefixes like 'WANDB_*', got {pattern!r}"
    return None


def _interface(value: str) -> str | None:
    return None if re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", value) else f"not an interface name: {value!r}"


@dataclass(frozen=True)
class SSHSpec:
    """Hosts and connection settings for SSH fan-out."""

    #: Hosts in hostfile syntax ('node1', 'node1 slots=2', 'node1:2'); or give ``hostfile``.
    hosts: tuple[str, ...] = ()
    hostfile: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: None: from ssh_config, else the head's user / port 22 / the default keys and the agent.
    user: str | None = None
    port: int | None = field(default=None, metadata=check(_port))
    identity_file: str | None = None
    config_file: str | None = None
    #: None: ssh_config's UserKnownHostsFile, else ~/.ssh/known_hosts (+ /etc/ssh/ssh_known_hosts).
    known_hosts: str | None = None
    #: Like OpenSSH's StrictHostKeyChecking=accept-new: unknown keys are added, changed keys refused.
    accept_new_host_keys: bool = False
    connect_timeout: float = field(default=10.0, metadata=check(_positive))
    #: Head variables forwarded besides the built-in allow-list (names, or prefixes ending in '*').
    env_allow: tuple[str, ...] = field(default=(), metadata=check(_env_patterns))
    #: Network interface for GLOO/NCCL_SOCKET_IFNAME on every host; None: detected per host.
    interface: str | None = field(default=None, metadata=check(_interface))
    #: Connections opened at once (each host's session lives for the whole job regardless).
    parallel: int = field(default=64, metadata=check(_positive))
