"""``clusterddp run`` on one node: detect, resolve, plan, then supervise (or only print)."""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Mapping

from clusterddp.envs import Overrides, detect
from clusterddp.errors import LaunchError
from clusterddp.launch.options import RunOptions
from clusterddp.launch.start import plan as planning
from clusterddp.launch.supervise import runlock
from clusterddp.launch.start import warm
from clusterddp.launch.observe.record import LaunchRecord, exit_code_of
from clusterddp.launch.observe.logs import say
from clusterddp.launch.start.rendezvous import master_wait, wait_for_master
from clusterddp.redact import passthrough_env, scrub
from clusterddp.spec import JobSpec
from clusterddp.topology import Topology, check_port_free, resolve

if TYPE_CHECKING:  # imported when needed: the zygote starts before the supervisor's imports (_run_placed)
    from clusterddp.launch.restart.stepcoord import StepCoordinator
    from clusterddp.launch.supervise.supervisor import LocalSupervisor, SupervisorOptions
    from clusterddp.launch.start.workers import WorkerPlan


def resolve_here(job: JobSpec, overrides: Overrides, env: Mapping[str, str],
                 node_workers: tuple[int, ...] | None = None,
                 restart_count: int | None = None) -> tuple[Topology, list[str] | None]:
    """This node's topology, and the command to exec instead when the environment asks
    (SLURM's batch script re-launches itself with srun on every node)."""
    environment = detect(env, overrides)
    # The command that started us, runnable on another node: not '.../__main__.py' (what
    # sys.argv[0] is under 'python -m clusterddp'), but this interpreter with -m clusterddp.
    relaunch = environment.relaunch([sys.executable, "-m", "clusterddp", *sys.argv[1:]])
    placement = environment.placement()
    topology = resolve(job, placement, env, master_port=overrides.master_port, nnodes=overrides.nnodes,
                       node_workers=node_workers, restart_count=restart_count)
    return topology, relaunch


def supervisor_options(job: JobSpec, topology: Topology, options: RunOptions,
                       run_dir: str | None = None) -> SupervisorOptions:
    from clusterddp.launch.supervise.supervisor import SupervisorOptions

    return SupervisorOptions(
        job_name=job.name,
        grace_period=job.grace_period,
        # Restarted as a whole from outside (--restart-count, OpenPAI's job retry): this
        # node alone never restarts, its peers would not come back with it.
        restarts=job.restarts if topology.restart_count is None else 0,
        first_attempt=topology.first_attempt,
        forward_signals=tuple(getattr(signal, name) for name in job.forward_signals),
        console_ranks=frozenset(job.logs.ranks) if job.logs.ranks is not None else None,
        prefix=job.logs.prefix,
        merge=job.logs.merge,
        watch_stdin=options.watch_stdin,
        heartbeat_timeout=options.heartbeat_timeout,
        report_json=options.report_json,
        await_restart=options.await_restart,
        hang_timeout=job.hang_timeout,
        run_dir=run_dir,
        restart_on=job.restart_on,
        restarted_outside=topology.restart_count is not None,
        warm_start=warm_start(job, os.getcwd()),
        preload=job.preload,
    )


def warm_start(job: JobSpec, cwd: str) -> bool:
    """The job's ``warm_start`` applied to its entry (warm.wanted)."""
    return warm.wanted(job.warm_start, job.entry_argv(), planning.workdir(job, cwd), job.preload)


def run_local(job: JobSpec, options: RunOptions, env: Mapping[str, str]) -> int:
    """Start and supervise this node's workers; return the launcher's exit code.

    Workers inherit the launcher's environment, so ``env_passthrough`` needs no copying here;
    a listed variable that is unset is an error before anything is planned or started.
    """
    passthrough_env(job.env_passthrough, env, job.source or "<command line>", job.env, job.line_of)
    if options.await_restart and not options.watch_stdin:
        raise LaunchError("--await-restart needs --watch-stdin: the word to restart comes on stdin",
                          "both are set by the SSH head; leave them out when starting a node by hand")
    patience = master_wait(env)
    overrides = options.overrides(job)
    topology, relaunch = resolve_here(job, overrides, env, options.workers_per_node, options.restart_count)
    cwd = os.getcwd()
    plans = planning.worker_plans(job, topology, env, cwd)
    if options.dry_run:  # names passthrough variables; a value typed into args is masked too
        if relaunch:
            print(scrub("would re-launch on every node: " + " ".join(relaunch)))
        print(scrub(planning.dry_run_text(job, topology, plans, env)))
        return 0
    if relaunch:
        sys.stdout.flush()
        os.execvp(relaunch[0], relaunch)
    # From here on this node runs a launcher: the batch script learns that, and how it ended.
    record = LaunchRecord(options.record_dir, topology.node_rank)
    record.started()
    try:
        code = _run_placed(job, options, topology, plans, overrides.master_port, patience, cwd, env)
    except BaseException as exc:
        record.ended(exit_code_of(exc))
        raise
    record.ended(code)
    return code


def _run_placed(job: JobSpec, options: RunOptions, topology: Topology, plans: list[WorkerPlan],
                master_port: int | None, patience: float, cwd: str, env: Mapping[str, str]) -> int:
    """Everything after this node knows its place: check, wait for the master, lock the logs,
    supervise the workers; the launcher's exit code."""
    planning.check_runnable(job, plans)
    for note in topology.notes:
        say(f"clusterddp: note: {note}")  # a closed console must not stop the job
    wait_for_master(topology.master_addr, topology.master_port, patience, say)
    if topology.node_rank == 0 and (master_port or job.master.port) and _is_local(topology.master_addr):
        check_port_free("", topology.master_port)
    run_dir = planning.run_dir(job, topology, cwd)
    locks = lock_logs(job, topology, options, run_dir, [plan.rank for plan in plans])
    try:
        if plans and warm_start(job, cwd):
            _prestart_zygote(plans[0], topology, job.preload)
        planning.prepare_logs(plans, keep=bool(topology.restart_count))
        supervision = supervisor_options(job, topology, options, run_dir)
        # imported here, once the zygote imports torch beside it: the supervisor's modules
        # are most of the launcher's own start-up (docs/warm-start.md: `warm.prestart`)
        from clusterddp.launch.supervise.supervisor import LocalSupervisor

        supervisor = LocalSupervisor(topology, plans, supervision)
        supervisor.relayout = lambda moved: _moved_plans(job, options, moved, env, cwd, run_dir, locks)
        step = step_coordinator(job, topology, options, supervisor)
        if step is not None:  # else the SSH head's word, if any (--await-restart: StdinWatch)
            supervisor.coordinator = step
        return supervisor.run()
    finally:
        warm.drop_prestarted()
        locks.release()


def _moved_plans(job: JobSpec, options: RunOptions, moved: Topology, env: Mapping[str, str], cwd: str,
                 run_dir: str, locks: runlock.RankLocks) -> list[WorkerPlan]:
    """This node's workers at its new place (a restart in place that renumbered the nodes:
    the SSH head, after an elastic job lost a host): planned as at the start, their logs
    locked anew (the old ranks let go first: a peer may take them over, as this node may take
    a lost node's, waiting for its launcher as a restart does) and kept (appended to)."""
    plans = planning.worker_plans(job, moved, env, cwd)
    locks.release()
    locks.fds = lock_logs(job, moved, options, run_dir, [plan.rank for plan in plans]).fds
    planning.prepare_logs(plans, keep=True)
    return plans


def _prestart_zygote(first: WorkerPlan, topology: Topology, preload: tuple[str, ...]) -> None:
    """The zygote started with what the worker group would start it with (its first worker's
    environment for the first attempt): it imports torch while the launcher finishes its own
    start (imports, reaper, cgroup) instead of after it. Here, after the run's logs are
    locked: its log sits beside theirs."""
    env = warm.zygote_environment(first.env.build(topology.first_attempt))
    warm.prestart(first.argv[0], env, preload, warm.zygote_log(first.log, env))


def step_coordinator(job: JobSpec, topology: Topology, options: RunOptions,
                     supervisor: LocalSupervisor) -> StepCoordinator | None:
    """Under the batch script (``--record-dir`` and ``--restart-count``) with restarts left:
    the launchers of the step restart in place (stepcoord); None otherwise."""
    if options.record_dir is None or topology.restart_count is None or topology.restart_count >= job.restarts:
        return None
    from clusterddp.launch.restart.stepcoord import StepCoordinator
    from clusterddp.launch.start.workers import TEARDOWN_SLACK

    return StepCoordinator(options.record_dir, topology, job.restarts, job.restart_on,
                           job.grace_period + TEARDOWN_SLACK, supervisor.runlog.peers, say)


#: Seconds a restart attempt waits, beyond the heartbeat timeout and the grace period, for the
#: previous attempt's launcher on this host to let go of its ranks' logs.
LOCK_WAIT_SLACK = 5.0


def lock_logs(job: JobSpec, topology: Topology, options: RunOptions, run_dir: str,
              ranks: list[int]) -> runlock.RankLocks:
    """This node's ranks' logs, locked for the launcher's life: a second job with the same run
    id is refused (one line, exit 2) before it truncates a log another launcher writes.

    A restart attempt from outside (``--restart-count`` > 0) may meet the previous attempt's
    launcher still stopping on this host (its SSH session lost: it stops within the heartbeat
    timeout and the grace period): it waits for it that long, then is refused too."""
    wait = options.heartbeat_timeout + job.grace_period + LOCK_WAIT_SLACK if topology.restart_count else 0.0
    return runlock.lock_ranks(run_dir, ranks, job.where("logs.dir"), topology.run_id, wait, say)


def _is_local(addr: str) -> bool:
    """True when ``addr`` belongs to this machine (so its port can be checked here)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, 0))
            return True
        except OSError:
            return False
