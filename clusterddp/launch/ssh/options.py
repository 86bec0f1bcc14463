"""What the command line adds to the job file for a fan-out over SSH."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable, Mapping, Sequence

from clusterddp.launch.ssh.preflight import HostSession


@dataclass(frozen=True)
class FanoutOptions:
    """What the command line adds to the job file for a fan-out (None: the job decides)."""

    #: Hostfile path; wins over ``ssh.hostfile`` and ``ssh.hosts`` of the job.
    hostfile: str | None = None
    #: Host globs; ``include`` replaces the job's, ``exclude`` adds to the job's.
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: ``--nproc-per-node`` as given (int, 'auto', 'gpu', 'cpu'): wins over hostfile slots.
    nproc_per_node: int | str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    #: Connect and preflight every host, print each host's plan and command, start nothing.
    dry_run: bool = False
    #: Flags every remote launcher gets as well (``--restarts 2``, ``--log-dir D`` ...): the
    #: remote reads the job file itself, so command-line overrides must travel with it.
    launcher_args: tuple[str, ...] = ()
    #: Remote working directory; default: the head's (a shared filesystem is assumed).
    cwd: str | None = None
    #: Head environment the allow-list is taken from; default ``os.environ``.
    head_env: Mapping[str, str] | None = None
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 6.0
    stdout: BinaryIO | None = None
    stderr: BinaryIO | None = None
    #: Run this instead of the job's script (``("-m", "pkg.mod", ...)``): the job still gives
    #: hosts, env, interpreter and workers per host. ``clusterddp doctor`` runs its worker so.
    command: tuple[str, ...] | None = None
    #: Called with every host's session once all probes are in, before the checks: the
    #: doctor prints each host's facts even when some host fails preflight.
    on_probed: Callable[[Sequence[HostSession]], None] | None = None
