"""The flags of ``clusterddp run`` as data: one row per flag, read by the CLI and the SSH head.

Why one table: a run flag used to be written in six places (the parser, its converter, its
variable, ``RunOptions``, the SSH head's list of flags to pass on, ``JobSpec``) and a new one
was easy to miss in one of them. A row now says all of it: the flag, the rule its text must
pass (the same validators as the job-file key it overrides), its help, whether it falls back
to ``CLUSTERDDP_<FLAG>``, the job-file key it overrides, and whether the SSH head passes it
on to every host's launcher (that launcher reads the job file itself, so an override must
travel with it). A new run flag is its row, plus its ``JobSpec`` field when it has a job key.

Nothing here sees argparse: ``cli`` turns the rows into a parser. A leaf of ``launch``: it
imports no launch module.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from clusterddp import validate
from clusterddp.affinity import MODES as AFFINITY_MODES

if TYPE_CHECKING:  # the CLI reads this table to build its parser: `clusterddp --help` loads no YAML
    from clusterddp.spec import JobSpec


class FlagProblem(ValueError):
    """A flag or variable value that breaks its rule; the message is the rule's problem."""


def integer(raw: str) -> int:
    if not validate.INTEGER_TEXT.fullmatch(raw):
        raise FlagProblem(f"expected an integer, got {validate.shown(raw)}")
    return int(raw)


def number(raw: str) -> float:
    if not _FLOAT.fullmatch(raw):
        raise FlagProblem(f"expected a number, got {validate.shown(raw)}")
    return float(raw)


_FLOAT = re.compile(r"-?(?:[0-9]{1,12}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})(?:[eE][-+]?[0-9]{1,3})?")


def checked(parse: Callable[[str], Any], *problems: Callable[[Any], str | None]) -> Callable[[str], Any]:
    """A converter: parse the text, then apply the same rules as the job-file key."""
    def convert(raw: str) -> Any:
        value = parse(raw)
        for problem_of in problems:
            problem = problem_of(value)
            if problem:
                raise FlagProblem(problem)
        return value
    return convert


def switch(raw: str) -> bool:
    """A switch's variable: 1/true/yes sets it, 0/false/no or empty (unset) leaves it off."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("", "0", "false", "no"):
        return False
    raise FlagProblem(f"expected 1 or 0 (true/false, yes/no), got {validate.shown(raw)}")


def text(problem_of: Callable[[str], str | None]) -> Callable[[str], str]:
    return checked(str, problem_of)


def choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def convert(raw: str) -> str:
        if raw in options:
            return raw
        raise FlagProblem(f"expected one of {', '.join(options)}, got {validate.shown(raw)}")
    return convert


def nproc_value(raw: str) -> int | str:
    if raw in ("auto", "gpu", "cpu"):
        return raw
    if not validate.INTEGER_TEXT.fullmatch(raw):
        raise FlagProblem(f"expected a number, 'auto', 'gpu' or 'cpu', got {validate.shown(raw)}")
    return int(checked(int, validate.workers_problem)(raw))


def ranks(raw: str) -> frozenset[int]:
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    if len(parts) > 4096 or not all(validate.INTEGER_TEXT.fullmatch(p) and int(p) >= 0 for p in parts):
        raise FlagProblem(f"expected ranks like 0,3, got {validate.shown(raw)}")
    return frozenset(int(p) for p in parts)


def node_workers(raw: str) -> tuple[int, ...]:
    """``--workers-per-node 2,1,1``: every node's worker count, in node-rank order."""
    parts = raw.split(",")
    if len(parts) > validate.MAX_NODES or not all(validate.INTEGER_TEXT.fullmatch(p) for p in parts):
        raise FlagProblem(f"expected worker counts like 2,1,1, got {validate.shown(raw)}")
    counts = tuple(int(p) for p in parts)
    for count in counts:
        problem = validate.workers_problem(count)
        if problem:
            raise FlagProblem(problem)
    return counts


def node_rank_problem(value: int) -> str | None:
    return None if 0 <= value < validate.MAX_NODES else f"must be 0-{validate.MAX_NODES - 1}, got {value}"


def run_id_problem(value: str) -> str | None:
    return validate.token_problem(value, "a run id")


def _absolute(path: str) -> str:
    """A flag's path is the caller's, from the current directory (a job key's, from the job file)."""
    return os.path.abspath(path)


def rank_list(value: frozenset[int]) -> str:
    """``--log-ranks`` as text again, for a remote launcher: ``0,1,3``."""
    return ",".join(str(rank) for rank in sorted(value))


@dataclass(frozen=True)
class Flag:
    """One flag of ``clusterddp run``."""

    #: ``--cpu-affinity``; its value lands in the options as ``cpu_affinity`` (``dest``).
    name: str
    #: The ``--help`` section it is listed in (``PLACEMENT``, ...).
    group: str
    help: str | None = None
    #: Text -> value, raising FlagProblem; None: a switch (given or not, takes no value).
    convert: Callable[[str], Any] | None = None
    #: Falls back to ``CLUSTERDDP_<FLAG>`` (``environ``) when not given.
    variable: bool = False
    #: The job-file key it overrides (dotted: ``logs.dir``); messages about it name the flag.
    job_key: str | None = None
    #: The value as that key takes it (default: as converted).
    to_job: Callable[[Any], Any] | None = None
    #: The SSH head passes it on to every host's launcher, as ``to_text`` writes the value.
    passed_on: bool = False
    to_text: Callable[[Any], str] = str
    metavar: str | None = None
    default: str | None = None
    #: May be given many times (``--include a --include b``): a list, each item checked.
    repeat: bool = False
    #: Also a flag of ``clusterddp env`` (the placement overrides).
    env_command: bool = False

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    @property
    def environ(self) -> str | None:
        """The ``CLUSTERDDP_*`` variable it falls back to, if any."""
        return f"CLUSTERDDP_{self.dest.upper()}" if self.variable else None

    def argv(self, value: Any) -> list[str]:
        """The flag and its value, as a remote launcher's command line takes them."""
        return [self.name] if self.convert is None else [self.name, self.to_text(value)]


def given(value: Any) -> bool:
    """A value the command line set: not left out (None), not a switch left off (False)."""
    return value is not None and value is not False


JOB_FILE = "job file"
PLACEMENT = "placement (override the detected cluster environment)"
FANOUT = "SSH fan-out"
SUPERVISION = "supervision and logs"
DEVICES = "devices"
REMOTE = "used by the SSH head on remote hosts"

#: Every flag of ``clusterddp run``, in ``--help`` order.
RUN_FLAGS: tuple[Flag, ...] = (
    Flag("--job-dir", JOB_FILE, "where the job file's relative paths start (default: its directory; a "
         "Kubernetes pod's job file comes from a ConfigMap)", text(validate.path_problem), variable=True,
         metavar="DIR"),
    Flag("--nproc-per-node", PLACEMENT, "workers on this node: a number, auto, gpu or cpu", nproc_value,
         variable=True, job_key="nproc_per_node", env_command=True),
    Flag("--nnodes", PLACEMENT, None, checked(integer, validate.nodes_problem), variable=True, env_command=True),
    Flag("--node-rank", PLACEMENT, None, checked(integer, node_rank_problem), variable=True, env_command=True),
    Flag("--master-addr", PLACEMENT, None, text(validate.host_problem), variable=True, env_command=True),
    Flag("--master-port", PLACEMENT, None, checked(integer, validate.port_problem), variable=True,
         env_command=True),
    Flag("--run-id", PLACEMENT, "names the log dir and seeds the derived master port", text(run_id_problem),
         variable=True, env_command=True),
    Flag("--hostfile", FANOUT, "hosts to fan out to: 'host', 'host slots=N' or 'host:N' per line",
         text(validate.path_problem), variable=True),
    Flag("--include", FANOUT, "only these hosts (repeatable)", text(validate.path_problem), repeat=True),
    Flag("--exclude", FANOUT, "not these hosts (repeatable)", text(validate.path_problem), repeat=True),
    Flag("--code", FANOUT, "ship this directory's tree to every host and run there (code.dir)",
         text(validate.path_problem), job_key="code.dir", to_job=_absolute, metavar="DIR"),
    Flag("--dry-run", SUPERVISION, "print ranks, commands and env; start nothing"),
    Flag("--detach", SUPERVISION, "return once every rank runs; the run goes on in its own session, its "
         "console in logs/<run-id>/console.log ('clusterddp attach RUN'); a hostfile run's head goes to its "
         "first host", job_key="detach"),
    Flag("--restarts", SUPERVISION, "restart the local group up to N times",
         checked(integer, validate.non_negative_problem), variable=True, job_key="restarts", passed_on=True),
    Flag("--grace-period", SUPERVISION, "seconds between SIGTERM and SIGKILL at teardown",
         checked(number, validate.seconds_problem), variable=True, job_key="grace_period", passed_on=True),
    Flag("--python", SUPERVISION, "interpreter for the workers (default: this one)", text(validate.path_problem),
         variable=True, job_key="python", passed_on=True),
    Flag("--log-dir", SUPERVISION, "per-rank log files go to DIR/<run-id>/", text(validate.path_problem),
         variable=True, job_key="logs.dir", passed_on=True),
    Flag("--log-ranks", SUPERVISION, "show only these ranks on the console, e.g. 0,1", ranks, variable=True,
         job_key="logs.ranks", to_job=lambda value: tuple(sorted(value)), passed_on=True, to_text=rank_list),
    Flag("--no-prefix", SUPERVISION, "no [host rank R] prefix on console lines", job_key="logs.prefix",
         to_job=lambda value: False, passed_on=True),
    Flag("--no-merge", SUPERVISION, "show every rank's line on the console, even when several ranks print the "
         "same line at once (default: one line, [host ranks 0-15] ...)", variable=True, job_key="logs.merge",
         to_job=lambda value: False, passed_on=True),
    Flag("--cpu-affinity", DEVICES, "CPUs of each worker: " + ", ".join(AFFINITY_MODES)
         + " (default auto: the cores of its GPU's NUMA node, or a disjoint share)", choice(AFFINITY_MODES),
         variable=True, job_key="cpu_affinity", passed_on=True),
    Flag("--virtual-local-rank", DEVICES,
         "each worker sees only its own GPU, as device 0, with LOCAL_RANK=0 (as torchrun)",
         job_key="virtual_local_rank", passed_on=True),
    Flag("--watch-stdin", REMOTE, "stop the workers when stdin closes or its keepalive stops"),
    Flag("--keepalive-timeout", REMOTE, None, checked(number, validate.positive_seconds_problem), default="6.0"),
    Flag("--emit-result", REMOTE, "print a CLUSTERDDP_RESULT line at the end"),
    Flag("--await-restart", REMOTE, "after a failed attempt, report it and wait for the head's word on stdin "
         "(run the next attempt here in place, or end), keeping the warm interpreter (needs --watch-stdin)"),
    Flag("--restart-count", REMOTE, "this start is attempt K of a job restarted as a whole (by the SSH head or "
         "the batch script): no restarts of this node alone", checked(integer, validate.non_negative_problem),
         variable=True, metavar="K"),
    Flag("--marks-dir", REMOTE, "write DIR/node<R>.started once placed and DIR/node<R>.exit at the end (the "
         "sbatch script reads them: srun exits 0 even when no task launched)", text(validate.path_problem),
         metavar="DIR"),
    Flag("--workers-per-node", REMOTE, "every node's workers in node-rank order; ranks are their prefix sums",
         node_workers, metavar="N,N,..."),
)


def passed_on(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values (by ``dest``) of the flags given that every host's launcher gets too."""
    return {row.dest: values[row.dest] for row in RUN_FLAGS
            if row.passed_on and given(values.get(row.dest))}


def remote_args(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The flags the SSH head adds to every host's ``clusterddp run`` (``--restarts 2`` ...),
    from the values ``passed_on`` kept, in table order."""
    return tuple(word for row in RUN_FLAGS if row.passed_on and given(values.get(row.dest))
                 for word in row.argv(values[row.dest]))


def apply_to_job(job: JobSpec, values: Mapping[str, Any]) -> JobSpec:
    """``job`` with the flags given that override its keys; messages about those keys name the
    flag (``JobSpec.given_by``)."""
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    given_by: dict[str, str] = {}
    for row in RUN_FLAGS:
        value = values.get(row.dest)
        if row.job_key is None or not given(value):
            continue
        value = row.to_job(value) if row.to_job else value
        section, _, key = row.job_key.rpartition(".")
        (sections.setdefault(section, {}) if section else top)[key] = value
        given_by[row.job_key] = row.name
    for section, changes in sections.items():
        top[section] = replace(getattr(job, section), **changes)
    return job.with_overrides(given_by=given_by, **top)
