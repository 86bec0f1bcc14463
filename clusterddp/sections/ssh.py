"""The ``ssh:`` section: how the head reaches bare hosts (docs/ssh.md explains each key).

Connection settings left out here come from the ssh_config file (``config_file``, else
``~/.ssh/config``) as OpenSSH would read them: values written in the job win, like options on
the ``ssh`` command line win over the config file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from clusterddp.errors import HostlistError
from clusterddp.specload import check, check_each
from clusterddp.validate import path_problem, port_problem, positive_seconds_problem, shown

ENV_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\*?")
INTERFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
#: A user name for ssh: POSIX portable names (a leading '-' would read as an option).
USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
#: ``link_timeout`` bounds, in seconds. Linux resends a lost segment after 0.2 s at the
#: earliest (TCP_RTO_MIN), then 0.4 s after that, and its user timeout counts from the first
#: resend: from 0.5 s on a lost packet gets two resends before a healthy link counts as lost,
#: below it one. A host's launcher stops on its own after 6 s without the head's keepalive
#: (``--keepalive-timeout``), so a link silent for longer has lost its host's workers anyway:
#: a longer timeout only notices later.
MIN_LINK_TIMEOUT = 0.5
MAX_LINK_TIMEOUT = 5.0


def _env_pattern(pattern: str) -> str | None:
    if ENV_PATTERN.fullmatch(pattern):
        return None
    return f"expected variable names or prefixes like 'WANDB_*', got {shown(pattern)}"


def _interface(value: str) -> str | None:
    return None if INTERFACE.fullmatch(value) else f"not an interface name: {shown(value)}"


def _user(value: str) -> str | None:
    return None if USER.fullmatch(value) else f"not a user name: {shown(value)}"


def _host(spec: str) -> str | None:
    """One ``ssh.hosts`` entry, by the hostfile's own rules (imported late: no cycle)."""
    from clusterddp.hostfile import entries_from_list

    try:
        entries_from_list([spec], "")
    except HostlistError as exc:
        return exc.message.partition(": ")[2] or exc.message
    return None


def _link_timeout(value: float) -> str | None:
    if not math.isfinite(value):
        return f"must be a finite number of seconds, got {value}"
    if value < MIN_LINK_TIMEOUT:
        return (f"must be at least {MIN_LINK_TIMEOUT:g} s, got {value:g}: below that a packet lost on a healthy "
                "link gets a single resend (Linux resends after 0.2 s at the earliest) before the link counts as lost")
    if value > MAX_LINK_TIMEOUT:
        return (f"must be at most {MAX_LINK_TIMEOUT:g} s, got {value:g}: a host's launcher stops its workers "
                "after 6 s without the head's keepalive, so a longer timeout only notices a dead host later")
    return None


def _parallel(value: int) -> str | None:
    return None if 1 <= value <= 4096 else f"must be 1-4096, got {value}"


@dataclass(frozen=True)
class SSHSpec:
    """Hosts and connection settings for SSH fan-out."""

    #: Hosts in hostfile syntax ('node1', 'node1 slots=2', 'node1:2'); or give ``hostfile``.
    hosts: tuple[str, ...] = field(default=(), metadata=check_each(_host))
    hostfile: str | None = field(default=None, metadata=check(path_problem))
    include: tuple[str, ...] = field(default=(), metadata=check_each(path_problem))
    exclude: tuple[str, ...] = field(default=(), metadata=check_each(path_problem))
    #: None: from ssh_config, else the head's user / port 22 / the default keys and the agent.
    user: str | None = field(default=None, metadata=check(_user))
    port: int | None = field(default=None, metadata=check(port_problem))
    identity_file: str | None = field(default=None, metadata=check(path_problem))
    config_file: str | None = field(default=None, metadata=check(path_problem))
    #: None: ssh_config's UserKnownHostsFile, else ~/.ssh/known_hosts (+ /etc/ssh/ssh_known_hosts).
    known_hosts: str | None = field(default=None, metadata=check(path_problem))
    #: Like OpenSSH's StrictHostKeyChecking=accept-new: unknown keys are added, changed keys refused.
    accept_new_host_keys: bool = False
    connect_timeout: float = field(default=10.0, metadata=check(positive_seconds_problem))
    #: Seconds the head's data to a host may go unacknowledged before the host counts as lost
    #: (each socket's TCP_USER_TIMEOUT; the head's keepalive keeps data in flight).
    link_timeout: float = field(default=1.0, metadata=check(_link_timeout))
    #: Head variables forwarded besides the built-in allow-list (names, or prefixes ending in '*').
    env_allow: tuple[str, ...] = field(default=(), metadata=check_each(_env_pattern))
    #: Network interface for GLOO/NCCL_SOCKET_IFNAME on every host; None: detected per host.
    interface: str | None = field(default=None, metadata=check(_interface))
    #: Connections opened at once (each host's session lives for the whole job regardless).
    parallel: int = field(default=64, metadata=check(_parallel))
