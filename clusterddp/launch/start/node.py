"""This node's place in the job and its workers, from the job file, the flags and the
environment: ``NodePlan``, the one value everything after planning reads (the dry run, the
checks before the start, the supervisor), built before anything is started."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Mapping

from clusterddp.envs import detect
from clusterddp.errors import LaunchError
from clusterddp.launch.options import RunOptions
from clusterddp.launch.start import plan as planning
from clusterddp.launch.start import warm
from clusterddp.launch.start.rendezvous import master_wait
from clusterddp.launch.start.workers import WorkerPlan
from clusterddp.redact import passthrough_env
from clusterddp.spec import JobSpec
from clusterddp.topology import Topology, resolve


@dataclass(frozen=True)
class NodePlan:
    job: JobSpec
    topology: Topology
    plans: list[WorkerPlan]
    #: The command to exec instead, when the environment asks (SLURM's batch script
    #: re-launches itself with srun on every node); None: run here.
    relaunch: list[str] | None
    cwd: str
    #: ``<logs.dir>/<run-id>``: launcher.json, the event log, the ranks' logs and their locks.
    run_dir: str
    #: Fork the workers from a warm interpreter (the job's ``warm_start`` applied: ``warm.wanted``).
    warm: bool
    #: Seconds to wait for the master's name to resolve (``rendezvous.master_wait``).
    patience: float
    #: The master port was chosen (a flag or the job file), not found free by us: node 0
    #: checks it is free before any worker starts.
    port_chosen: bool

    def dry_run_text(self, env: Mapping[str, str]) -> str:
        return planning.dry_run_text(self.job, self.topology, self.plans, env)

    def moved_to(self, topology: Topology, env: Mapping[str, str]) -> list[WorkerPlan]:
        """This node's workers at another place in the job (a restart in place that
        renumbered the nodes), planned as at the start."""
        return planning.worker_plans(self.job, topology, env, self.cwd)


def plan_node(job: JobSpec, options: RunOptions, env: Mapping[str, str], cwd: str) -> NodePlan:
    """Workers inherit the launcher's environment, so ``env_passthrough`` needs no copying
    here; a listed variable that is unset is an error before anything is planned."""
    passthrough_env(job.env_passthrough, env, job.source or "<command line>", job.env, job.line_of)
    if options.await_restart and not options.watch_stdin:
        raise LaunchError("--await-restart needs --watch-stdin: the word to restart comes on stdin",
                          "both are set by the SSH head; leave them out when starting a node by hand")
    patience = master_wait(env)
    overrides = options.overrides(job)
    environment = detect(env, overrides)
    # The command that started us, runnable on another node: not '.../__main__.py' (what
    # sys.argv[0] is under 'python -m clusterddp'), but this interpreter with -m clusterddp.
    relaunch = environment.relaunch([sys.executable, "-m", "clusterddp", *sys.argv[1:]])
    topology = resolve(job, environment.placement(), env, master_port=overrides.master_port,
                       nnodes=overrides.nnodes, node_workers=options.workers_per_node,
                       restart_count=options.restart_count)
    return NodePlan(job=job, topology=topology, plans=planning.worker_plans(job, topology, env, cwd),
                    relaunch=relaunch, cwd=cwd, run_dir=planning.run_dir(job, topology, cwd),
                    warm=warm.wanted(job.warm_start, job.entry_argv(), planning.workdir(job, cwd), job.preload),
                    patience=patience, port_chosen=bool(overrides.master_port or job.master.port))

