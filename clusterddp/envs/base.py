"""The contract every cluster environment fulfils.

An environment reads a mapping it is given (never ``os.environ`` directly, so tests use
plain dicts) and the CLI's explicit flags, and says where this node sits: how many nodes,
which one this is, where the master is. It changes nothing; ``topology.resolve`` combines
its answer with the job file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Mapping

from clusterddp.errors import EnvironmentDetectionError
from clusterddp.validate import (MAX_COUNT, MAX_NODES, MAX_WORKERS_ENV, as_token, host_problem, id_problem,
                                 int_text_problem, max_workers_per_node)

if TYPE_CHECKING:
    from clusterddp.spec import JobSpec


@dataclass(frozen=True)
class Overrides:
    """Placement flags from the command line (``--nnodes`` ...); None means not given."""

    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    #: The job being run, for environments whose variable names depend on it (OpenPAI's
    #: task role and port label); None for ``clusterddp env`` without a job file.
    job: "JobSpec | None" = field(default=None, compare=False)

    @property
    def any_given(self) -> bool:
        """A node rank or master on the command line: the user places this node by hand.

        ``--nnodes`` alone does not count: under SLURM or OpenPAI it only cross-checks the
        scheduler's count (see ``topology.resolve``).
        """
        return self.node_rank is not None or self.master_addr is not None


@dataclass(frozen=True)
class Placement:
    """Where this node sits, as one cluster environment sees it.

    ``None`` means "this environment does not say"; ``topology.resolve`` then falls back to
    the job file or a default (a derived or free port, the job's ``nproc_per_node``).
    """

    env: str
    nnodes: int
    node_rank: int
    master_addr: str | None = None
    master_port: int | None = None
    nproc_per_node: int | None = None
    #: torchrun's word for the workers per node, as the scheduler gave it (``PET_NPROC_PER_NODE``
    #: = ``auto``, ``gpu`` or ``cpu``), counted on this node the way torchrun counts it: one per
    #: visible GPU (``auto`` without a GPU: one per CPU this pod was given). A job file's number,
    #: ``gpu`` or ``cpu`` wins; its ``auto`` takes this.
    nproc_word: str | None = None
    hosts: tuple[str, ...] = ()
    run_id: str | None = None
    #: Things the user should know (e.g. "per-task mode detected"), shown by ``env`` and ``run``.
    notes: tuple[str, ...] = ()
    #: Set where the scheduler itself restarts the whole job (OpenPAI's job retry): this
    #: start is attempt K (TORCHELASTIC_RESTART_COUNT=K), and the node never restarts its
    #: workers alone, as with ``--restart-count K``. None: the node's own ``restarts`` apply.
    restart_count: int | None = None


class ClusterEnv(ABC):
    """One way a node can learn its place: CLI flags, torchrun, OpenPAI, SLURM, MPI, local."""

    #: Short name shown by ``clusterddp env``.
    name: ClassVar[str]
    #: The variables (or flags) this environment looks for, listed when nothing matches.
    looks_for: ClassVar[str]

    def __init__(self, env: Mapping[str, str], overrides: Overrides) -> None:
        self.env = env
        self.overrides = overrides

    @abstractmethod
    def detected(self) -> bool:
        """True when this environment's variables are present (cheap, no side effects)."""

    @abstractmethod
    def placement(self) -> Placement:
        """This node's placement; raises EnvironmentDetectionError naming a bad variable."""

    def relaunch(self, argv: list[str]) -> list[str] | None:
        """A command to exec instead of starting workers here, or None.

        SLURM uses it: ``clusterddp run`` in the batch script (outside any step) must become
        ``srun --ntasks-per-node=1 clusterddp run ...`` so one launcher runs on every node.
        ``argv`` is the launcher's own command line (``sys.argv``).
        """
        return None

    def error(self, name: str, problem: str, hint: str | None = None) -> EnvironmentDetectionError:
        """The one-line error for a bad variable: ``<env>: <NAME>: <problem>``."""
        return EnvironmentDetectionError(f"{self.name}: {name}: {problem}", hint)

    def raw_var(self, name: str) -> str | None:
        """A variable's exact value; unset and empty (``export X=``) both mean not given.

        Nothing is stripped: a value with blanks or a newline is wrong, and the validators
        say so instead of quietly repairing it.
        """
        raw = self.env.get(name)
        return raw if raw else None

    def first_var(self, *names: str) -> str | None:
        """The value of the first of ``names`` that is set, unchecked (for presence tests)."""
        for name in names:
            raw = self.raw_var(name)
            if raw is not None:
                return raw
        return None

    def which(self, *names: str) -> str:
        """The first of ``names`` that is set (for messages); the first name when none is."""
        return next((name for name in names if self.raw_var(name) is not None), names[0])

    def int_var(self, name: str, low: int = 0, high: int = MAX_NODES) -> int:
        """A strict decimal integer in ``low..high``, or an error naming the variable."""
        raw = self.raw_var(name)
        if raw is None:
            raise EnvironmentDetectionError(f"{self.name}: {name} is not set")
        problem = int_text_problem(raw, low, high)
        if problem is not None:
            raise self.error(name, problem)
        return int(raw)

    def first_int_var(self, *names: str, low: int = 0, high: int = MAX_NODES) -> int | None:
        """The first of ``names`` that is set, as a checked integer; None when none is set."""
        for name in names:
            if self.raw_var(name) is not None:
                return self.int_var(name, low, high)
        return None

    def port_var(self, *names: str) -> int | None:
        """The first of ``names`` that is set, as a port number 1-65535."""
        return self.first_int_var(*names, low=1, high=65535)

    def nodes_var(self, *names: str) -> int | None:
        """A node count: 1 to ``MAX_NODES``."""
        return self.first_int_var(*names, low=1, high=MAX_NODES)

    def host_var(self, *names: str) -> str | None:
        """The first of ``names`` that is set, checked as a host name or IP address."""
        for name in names:
            raw = self.raw_var(name)
            if raw is not None:
                problem = host_problem(raw)
                if problem is not None:
                    raise self.error(name, problem)
                return raw
        return None

    def id_var(self, *names: str) -> str | None:
        """An id the cluster chose (a job id, ``user~job``): one bounded line, else an error.
        It becomes a run id through ``run_id_from`` once composed (array ids, attempts)."""
        for name in names:
            raw = self.raw_var(name)
            if raw is not None:
                problem = id_problem(raw)
                if problem is not None:
                    raise self.error(name, problem)
                return raw
        return None

    def workers_var(self, name: str, low: int = 0) -> int | None:
        """A scheduler's workers-per-node hint, within the same bound as ``nproc_per_node``.
        ``low=1`` where 0 is no hint but a wrong value (torchrun's count of workers)."""
        count = self.first_int_var(name, high=MAX_COUNT)
        bound = max_workers_per_node(dict(self.env))
        if count is not None and count < low:
            raise self.error(name, f"expected {low} to {bound} workers per node, got {count}")
        if count is not None and count > bound:
            raise self.error(name, f"{count} workers on one node is over the bound of {bound}",
                             f"set {MAX_WORKERS_ENV} to go past it")
        return count


def run_id_from(cluster_id: str | None) -> str | None:
    """The run id (a directory under logs/, the seed of the derived port) made from an id the
    cluster chose: a plain token, the same on every node (``validate.as_token``)."""
    return as_token(cluster_id) if cluster_id is not None else None
