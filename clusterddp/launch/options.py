"""The options records of ``clusterddp run``: what the command line adds to the job file, and
the one choice they make with it: fan out over SSH or run on this node (``wants_fanout``).

A leaf of ``launch``: it imports no other launch module, so the entry point (``cli``), the run
on this node (``launch.local``) and the SSH head (``launch.ssh.fanout``) all read these
records without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from clusterddp.envs.base import Overrides
from clusterddp.spec import JobSpec


@dataclass(frozen=True)
class RunOptions:
    """What the command line adds to the job file, already checked (the CLI builds it from
    flags and ``CLUSTERDDP_*`` variables). None: the job file or the environment decides."""

    #: Placement: override what the cluster environment says.
    nproc_per_node: int | str | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    #: SSH fan-out: hostfile (wins over the job's ssh.hosts / ssh.hostfile) and host globs.
    hostfile: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: Print ranks, commands and env; start nothing.
    dry_run: bool = False
    #: The flags given that override job-file keys (``launch.flags.RUN_FLAGS`` rows marked
    #: ``passed_on``), by name: already applied to the job; a fan-out passes them on to every
    #: remote launcher, which reads the job file itself.
    passed_on: Mapping[str, Any] = field(default_factory=dict)
    #: Set by the SSH head on the remote launchers: stop when stdin closes or goes silent.
    watch_stdin: bool = False
    keepalive_timeout: float = 6.0
    emit_result: bool = False
    #: Set by the SSH head while the job has restarts left: after a failed attempt this
    #: launcher reports and waits for the head's word (restart in place, or end) on stdin.
    await_restart: bool = False
    #: Set where something outside this node restarts the whole job (the SSH head, the batch
    #: script): this start is that attempt (TORCHELASTIC_RESTART_COUNT), and the node never
    #: restarts its group alone (its peers would not come back with it).
    restart_count: int | None = None
    #: Every node's worker count (hosts with different slots): ranks are their prefix sums.
    workers_per_node: tuple[int, ...] | None = None
    #: Set by the sbatch script: the launcher marks there that it started and how it ended
    #: (clusterddp.launch.observe.marks), since srun's status alone says 0 when no task launched.
    marks_dir: str | None = None

    def overrides(self, job: JobSpec | None = None) -> Overrides:
        """The placement flags, for the cluster environments."""
        return Overrides(nnodes=self.nnodes, node_rank=self.node_rank, master_addr=self.master_addr,
                         master_port=self.master_port, run_id=self.run_id, job=job)


def wants_fanout(job: JobSpec, options: RunOptions) -> bool:
    """Fan out over SSH: a hostfile was given, or the job names hosts and no flag places this node."""
    if options.watch_stdin or options.node_rank is not None:
        return False  # a launcher the head started on a host: never fan out again
    if options.hostfile:
        return True
    return bool(job.ssh.hosts or job.ssh.hostfile) and not options.overrides(job).any_given
