"""``clusterddp run`` on one node: plan (``start.node``), then supervise (or only print)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Mapping

from clusterddp.launch.observe.logs import say
from clusterddp.launch.observe.marks import LaunchMarks, exit_code_of
from clusterddp.launch.options import RunOptions
from clusterddp.launch.start import plan as planning
from clusterddp.launch.start import warm
from clusterddp.launch.start.node import NodePlan, plan_node
from clusterddp.launch.start.rendezvous import wait_for_master
from clusterddp.launch.supervise import runlock
from clusterddp.redact import scrub
from clusterddp.spec import JobSpec
from clusterddp.topology import Topology, check_master_port_free

if TYPE_CHECKING:  # imported when needed: the zygote starts before the supervisor's imports (_run_placed)
    from clusterddp.launch.start.workers import WorkerPlan


def run_local(job: JobSpec, options: RunOptions, env: Mapping[str, str]) -> int:
    """Start and supervise this node's workers; return the launcher's exit code."""
    node = plan_node(job, options, env, os.getcwd())
    if options.dry_run:  # names passthrough variables; a value typed into args is masked too
        if node.relaunch:
            print(scrub("would re-launch on every node: " + " ".join(node.relaunch)))
        print(scrub(node.dry_run_text(env)))
        return 0
    if node.relaunch:
        sys.stdout.flush()
        os.execvp(node.relaunch[0], node.relaunch)
    # From here on this node runs a launcher: the batch script learns that, and how it ended.
    record = LaunchMarks(options.marks_dir, node.topology.node_rank)
    record.started()
    try:
        code = _run_placed(node, options, env)
    except BaseException as exc:
        record.ended(exit_code_of(exc))
        raise
    record.ended(code)
    return code


def _run_placed(node: NodePlan, options: RunOptions, env: Mapping[str, str]) -> int:
    """Everything after this node knows its place: check, wait for the master, lock the logs,
    supervise the workers; the launcher's exit code."""
    topology, plans = node.topology, node.plans
    planning.check_runnable(node.job, plans)
    for note in topology.notes:
        say(f"clusterddp: note: {note}")  # a closed console must not stop the job
    wait_for_master(topology.master_addr, topology.master_port, node.patience, say)
    if topology.node_rank == 0 and node.port_chosen:
        check_master_port_free(topology.master_addr, topology.master_port)
    locks = lock_logs(node, topology, options)
    try:
        if plans and node.warm:
            warm.prestart_for(plans[0].argv[0], plans[0].env.build(topology.first_attempt), node.job.preload,
                              plans[0].log)
        planning.prepare_logs(plans, keep=bool(topology.restart_count))
        # imported here, once the zygote imports torch beside it: the supervisor's modules
        # are most of the launcher's own start-up (docs/warm-start.md: `warm.prestart`)
        from clusterddp.launch.supervise.supervisor import LocalSupervisor, supervisor_options

        return LocalSupervisor(topology, plans, supervisor_options(node, options),
                               relayout=lambda moved: _moved_plans(node, options, moved, env, locks)).run()
    finally:
        warm.drop_prestarted()
        locks.release()


def _moved_plans(node: NodePlan, options: RunOptions, moved: Topology, env: Mapping[str, str],
                 locks: runlock.RankLocks) -> list[WorkerPlan]:
    """This node's workers at its new place (a restart in place that renumbered the nodes:
    the SSH head, after an elastic job lost a host): planned as at the start, their logs
    locked anew (the old ranks let go first: a peer may take them over, as this node may take
    a lost node's, waiting for its launcher as a restart does) and kept (appended to)."""
    plans = node.moved_to(moved, env)
    locks.release()
    locks.fds = lock_logs(node, moved, options, [plan.rank for plan in plans]).fds
    planning.prepare_logs(plans, keep=True)
    return plans


#: Seconds a restart attempt waits, beyond the keepalive timeout and the grace period, for the
#: previous attempt's launcher on this host to let go of its ranks' logs.
LOCK_WAIT_SLACK = 5.0


def lock_logs(node: NodePlan, topology: Topology, options: RunOptions,
              ranks: list[int] | None = None) -> runlock.RankLocks:
    """This node's ranks' logs (``ranks``, else its planned workers'), locked for the
    launcher's life: a second job with the same run id is refused (one line, exit 2) before
    it truncates a log another launcher writes.

    A restart attempt from outside (``--restart-count`` > 0) may meet the previous attempt's
    launcher still stopping on this host (its SSH session lost: it stops within the keepalive
    timeout and the grace period): it waits for it that long, then is refused too."""
    wait = options.keepalive_timeout + node.job.grace_period + LOCK_WAIT_SLACK if topology.restart_count else 0.0
    ranks = [plan.rank for plan in node.plans] if ranks is None else ranks
    return runlock.lock_ranks(node.run_dir, ranks, node.job.where("logs.dir"), topology.run_id, wait, say)
