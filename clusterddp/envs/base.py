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
    hosts: tuple[str, ...] = ()
    run_id: str | None = None
    #: Things the user should know (e.g. "per-task mode detected"), shown by ``env`` and ``run``.
    notes: tuple[str, ...] = ()


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

    def int_var(self, name: str) -> int:
        """An integer variable, or an error that names it and its value."""
        from clusterddp.errors import EnvironmentDetectionError

        raw = self.env.get(name)
        if raw is None:
            raise EnvironmentDetectionError(f"{self.name}: {name} is not set")
        try:
            return int(raw.strip())
        except ValueError:
            raise EnvironmentDetectionError(f"{self.name}: {name}={raw!r} is not an integer") from None

    def first_int_var(self, *names: str) -> int | None:
        """The first of ``names`` that is set, as an integer; None when none is set."""
        for name in names:
            if self.env.get(name, "").strip():
                return self.int_var(name)
        return None

    def first_var(self, *names: str) -> str | None:
        for name in names:
            value = self.env.get(name, "").strip()
            if value:
                return value
        return None
