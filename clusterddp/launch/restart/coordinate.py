"""Whole-job restarts in place: a node's launcher that outlives a failed attempt.

A job restarted as a whole from outside (the SSH head, SLURM node 0) used to lose every
node's launcher with the attempt: a new launcher, a new interpreter that imports torch
again (the zygote), new SSH sessions or a new srun step: seconds per fault. With a
``Coordinator`` the launcher instead reports the attempt's end to whoever decides, waits for
the decision, and on "restart" forks the next attempt's workers from the zygote it already
has. The decision stays with the one that sees every node (its peers would not come back
with a node that restarted alone); this module is only the node's side of the exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence, runtime_checkable

from clusterddp.launch.observe.exits import WorkerExit
from clusterddp.launch.restart.verdict import Failure, RankEnd
from clusterddp.launch.start.workers import WorkerPlan
from clusterddp.topology import Topology


@dataclass(frozen=True)
class AttemptEnded:
    """What this node knows when one of its attempts failed: the decider's input."""

    #: The attempt's number (its workers' TORCHELASTIC_RESTART_COUNT).
    attempt: int
    exit_code: int
    #: The first failed worker of this node (None: a hang, or no worker failed here).
    root: WorkerExit | None
    failure: Failure | None
    #: Did a rank of this node complete a step in the attempt.
    progressed: bool
    #: The hang's reason, when the attempt was found hung.
    hang: str | None
    #: How each of this node's ranks ended (the verdict weighs every rank of the job).
    ranks: tuple[RankEnd, ...] = ()


@dataclass(frozen=True)
class Restart:
    """The decision to run attempt ``attempt`` in place: on the same nodes, or (``node_rank``
    given) on what is left of them after an elastic job lost some."""

    attempt: int
    #: The next attempt's master port (each attempt may get its own); None: the same.
    master_port: int | None = None
    #: This node's rank in the next attempt, when the job's nodes changed; None: the same.
    node_rank: int | None = None
    #: Then every node's workers, in node-rank order (the node count is its length).
    node_workers: tuple[int, ...] = ()
    #: Then the master's new address, when node 0 went; None: the same.
    master_addr: str | None = None


class Coordinator(Protocol):
    """The node's side of a whole-job restart decided elsewhere."""

    def next_attempt(self, ended: AttemptEnded, stopping: Callable[[], bool]) -> Restart | None:
        """Report ``ended`` and wait for the decision: the next attempt, or None (this
        launcher ends with the attempt's exit code). ``stopping`` turns True when the
        launcher is told to stop meanwhile: return None then, at once."""
        ...


@runtime_checkable
class PeerWatch(Protocol):
    """A coordinator that also learns, during an attempt, that another node's attempt ended
    (under SLURM, from the step's shared directory): this node then ends its attempt at once
    instead of waiting for its ranks' next collective to fail."""

    def ended_elsewhere(self, attempt: int) -> str | None:
        """Why this node's attempt ``attempt`` ends too (another node's ended); None: it goes
        on. Called every turn of the supervisor's loop: cheap, rate-limited by itself."""
        ...


def next_place(topology: Topology, plans: Sequence[WorkerPlan], told: Restart,
               relayout: Callable[[Topology], list[WorkerPlan]] | None) -> tuple[Topology, list[WorkerPlan]]:
    """This node's topology and workers for the attempt ``told`` runs in place: the same
    node on the next master port, or the node moved (``relaid``) and its workers planned
    there by ``relayout``. ValueError: this node cannot take the place it is told to (a
    decider of another mind: the launcher ends with its attempt)."""
    if told.node_rank is None:
        return topology, replanned(plans, told.master_port)
    if relayout is None:
        raise ValueError("nothing here plans its workers anew")
    moved = relaid(topology, told)
    return moved, relayout(moved)


def replanned(plans: Sequence[WorkerPlan], master_port: int | None) -> list[WorkerPlan]:
    """The same workers for the next attempt, on its master port."""
    if master_port is None:
        return list(plans)
    return [replace(plan, env=replace(plan.env, topology=replace(plan.env.topology, master_port=master_port)))
            for plan in plans]


def relaid(topology: Topology, told: Restart) -> Topology:
    """This node's topology for a restart that moved it (``told.node_rank``): its node rank,
    the node count, every node's workers and (node 0 gone) the master from the decision; its own workers stay (the
    decider counted them), so a decision that says otherwise is refused rather than obeyed.
    The nodes' names are dropped: the decider did not say which went."""
    workers = told.node_workers
    if told.node_rank is None or not 0 <= told.node_rank < len(workers):
        raise ValueError(f"no place for this node in {told}")
    if workers[told.node_rank] != topology.workers_on(topology.node_rank):
        raise ValueError(f"node {told.node_rank} is told to run {workers[told.node_rank]} workers; "
                         f"it runs {topology.workers_on(topology.node_rank)}")
    uneven = len(set(workers)) > 1
    return replace(topology, nnodes=len(workers), node_rank=told.node_rank,
                   nproc_per_node=topology.workers_on(topology.node_rank),
                   node_workers=workers if uneven else (), hosts=(), restart_count=told.attempt,
                   master_port=topology.master_port if told.master_port is None else told.master_port,
                   master_addr=told.master_addr or topology.master_addr)
