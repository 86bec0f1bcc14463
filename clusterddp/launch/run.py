"""``clusterddp run``: the choice between a fan-out over SSH and a run on this node."""

from __future__ import annotations

from typing import Mapping

from clusterddp.launch.options import RunOptions
from clusterddp.spec import JobSpec


def wants_fanout(job: JobSpec, options: RunOptions) -> bool:
    """Fan out over SSH: a hostfile was given, or the job names hosts and no flag places this node."""
    if options.watch_stdin or options.node_rank is not None:
        return False  # a launcher the head started on a host: never fan out again
    if options.hostfile:
        return True
    return bool(job.ssh.hosts or job.ssh.hostfile) and not options.overrides(job).any_given


def run_job(job: JobSpec, options: RunOptions, env: Mapping[str, str]) -> int:
    """Run ``job`` (fanned out, or on this node); return the launcher's exit code."""
    if wants_fanout(job, options):
        from clusterddp.launch.ssh.fanout import fanout_options, run_fanout

        return run_fanout(job, fanout_options(options))
    from clusterddp.launch.local import run_local

    return run_local(job, options, env)
