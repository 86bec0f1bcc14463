"""The written interface every scheduler implements (as TorchX's ``Scheduler`` does).

A scheduler is a class with a name, the actions it has, and its own flags as data (``Flag``
rows: the CLI builds argparse from them, so nothing here sees argparse). ``render`` is pure:
job and options in, a ``RenderedRequest`` out, which prints itself as the script or manifest
and names how it is submitted. ``submit`` sends a rendered request (``render`` is the dry
run, ``submit`` the scheduling); ``status``, ``stop`` and ``logs`` exist where the platform
has them. ``main`` runs one action the same way for every scheduler, so the CLI stays
generic and a new platform is one module plus one line in ``SCHEDULERS``.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Generic, Mapping, Protocol, Sequence, TypeVar

from clusterddp.atomicfile import output_path
from clusterddp.errors import ClusterDDPError
from clusterddp.registry.store import RunRecord
from clusterddp.schedulers.common import ACTIONS, write_output
from clusterddp.spec import JobSpec, load_job
from clusterddp.validate import positive_seconds_problem

@dataclass(frozen=True)
class Flag:
    """One flag (or positional argument) of a scheduler, as data the CLI turns into argparse.

    Declared by the scheduler so that its flags live beside the code that reads them, and the
    CLI needs no change when a scheduler gains one.
    """

    #: The field of the scheduler's options that receives the value.
    dest: str
    #: ``("--url",)`` or ``("-o", "--output")``; empty for a positional argument named ``dest``.
    names: tuple[str, ...] = ()
    help: str | None = None
    #: The actions that take this flag; None: every action the scheduler has.
    actions: tuple[str, ...] | None = None
    #: A switch (``--dry-run``) takes no value and is True when given.
    switch: bool = False
    #: Converts the text (a failure is a usage error naming the flag); None keeps the text.
    convert: Callable[[str], Any] | None = None
    #: The value when the flag is not given (None: the options dataclass's own default).
    default: Any = None
    #: How the value is shown in usage lines (``USER~JOB``).
    metavar: str | None = None

    def applies_to(self, action: str) -> bool:
        return self.actions is None or action in self.actions


def seconds(raw: str) -> float:
    """A flag's duration: finite and positive (``float`` alone takes 'nan', 'inf' and '-1').
    argparse names the flag and the converter in its one-line refusal."""
    value = float(raw)
    if positive_seconds_problem(value) is not None:
        raise ValueError(raw)
    return value


@dataclass(frozen=True)
class RenderedRequest:
    """What ``render`` made of a job: the text to submit, and how it is submitted.

    ``str(request)`` is exactly what ``clusterddp render`` prints, so the dry run and the
    submitted text cannot differ.
    """

    #: The script or manifest, byte for byte.
    text: str
    #: The command or call that submits it, as one line a person can read or run by hand.
    submit_command: str
    #: The job it was rendered from (``submit`` needs its log dir, name, secrets by name).
    job: JobSpec = field(repr=False)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Submitted:
    """What a ``submit`` left on the platform, for the run registry (``clusterddp ls``,
    ``status``/``stop``/``logs`` by run id): the id the platform gave, and the options its
    other actions need again (never a secret: a token *file*'s name at most)."""

    #: The platform's id: SLURM's job id, OpenPAI's ``user~job``, the object kubectl created.
    job_id: str
    #: The scheduler's options field that takes the id in ``status``/``stop``/``logs``.
    id_field: str
    #: The launchers' run directory (``<logs.dir>/<their run id>``), where it is known.
    run_dir: str = ""
    #: Where it went, in words (``namespace ml, context prod``; an OpenPAI URL).
    where: str = ""
    #: The console the platform writes (SLURM's batch log), where it is known.
    console: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)


class Options(Protocol):
    """What every scheduler's options dataclass has: the action, and the job file if any."""

    @property
    def action(self) -> str: ...

    @property
    def job(self) -> str | None: ...


O = TypeVar("O", bound=Options)


class Scheduler(ABC, Generic[O]):
    """One platform that takes jobs. Subclasses set the class attributes and implement
    ``render``, and override the actions they list in ``actions``."""

    #: The name on the command line (``clusterddp render NAME``).
    name: ClassVar[str]
    #: The actions this scheduler has, a subset of ACTIONS.
    actions: ClassVar[tuple[str, ...]]
    #: Its flags, in the order its ``--help`` lists them.
    flags: ClassVar[tuple[Flag, ...]]
    #: The ``--help`` description of each action.
    descriptions: ClassVar[Mapping[str, str]]
    #: The frozen dataclass the parsed flags become (fields: ``action`` plus each flag's dest).
    options_type: ClassVar[Callable[..., Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A scheduler that lists an action it does not implement fails when its module is
        imported, not when a user first tries the action."""
        super().__init_subclass__(**kwargs)
        for action in getattr(cls, "actions", ()):
            if action not in ACTIONS:
                raise TypeError(f"{cls.__name__}: unknown action {action!r} (known: {', '.join(ACTIONS)})")
            if action in ("submit", "status", "stop", "logs") and getattr(cls, action) is getattr(Scheduler, action):
                raise TypeError(f"{cls.__name__} lists {action!r} but does not implement it")

    #: Set by ``submit`` when it submitted (not on a dry run): what the registry records.
    submitted: Submitted | None = None

    def check_action(self, action: str) -> None:
        """Refuse an action this scheduler does not have, before any flag is read."""
        if action not in self.actions:
            raise ClusterDDPError(f"{self.name} supports {', '.join(self.actions)}, not {action!r}")

    def flags_for(self, action: str) -> tuple[Flag, ...]:
        return tuple(flag for flag in self.flags if flag.applies_to(action))

    def options(self, action: str, values: Mapping[str, Any]) -> O:
        """The options dataclass from the parsed values; a value left None keeps its default."""
        given = {key: value for key, value in values.items() if value is not None}
        options: O = self.options_type(action=action, **given)
        return options

    def load(self, options: O) -> JobSpec:
        """The job file named by the options (``render`` and ``submit``)."""
        return load_job(str(options.job))

    @abstractmethod
    def render(self, job: JobSpec, options: O) -> RenderedRequest:
        """The request for ``job``; pure: no file written, nothing sent, no clock read."""

    def wrote(self, request: RenderedRequest, path: str) -> None:
        """Tell the user what to do with a request ``render -o PATH`` wrote."""
        print(f"wrote {path}", file=sys.stderr)

    def submit(self, request: RenderedRequest, options: O, env: Mapping[str, str]) -> int:
        """Send the request to the platform (or, with a dry run, say what would be sent)."""
        raise self._missing("submit")

    def status(self, options: O, env: Mapping[str, str]) -> int:
        raise self._missing("status")

    def stop(self, options: O, env: Mapping[str, str]) -> int:
        raise self._missing("stop")

    def logs(self, options: O, env: Mapping[str, str]) -> int:
        raise self._missing("logs")

    def refresh(self, records: Sequence[RunRecord], env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """What the platform says now of these runs it took (``clusterddp ls``): run id ->
        changed record fields, from one question for all of them. None here: the records
        stay as ``submit`` left them (``clusterddp status RUN`` asks the platform)."""
        return {}

    def main(self, options: O, env: Mapping[str, str] | None = None) -> int:
        """Run ``options.action``: the one path every scheduler's actions take from the CLI."""
        self.check_action(options.action)
        env = os.environ if env is None else env
        if options.action in ("render", "submit"):
            output = getattr(options, "output", None)
            if output is not None:
                output_path(output, f"{options.action} {self.name}")
            request = self.render(self.load(options), options)
            if options.action == "submit":
                return self.submit(request, options, env)
            if output is None:
                sys.stdout.write(str(request))
                return 0
            write_output(output, str(request))
            self.wrote(request, output)
            return 0
        action: Callable[[O, Mapping[str, str]], int] = getattr(self, options.action)
        return action(options, env)

    def _missing(self, action: str) -> ClusterDDPError:
        """Called directly for an action this scheduler does not have (``main`` refuses first)."""
        return ClusterDDPError(f"{self.name} supports {', '.join(self.actions)}, not {action!r}")
