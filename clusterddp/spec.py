"""The job file: one YAML document -> one frozen, typed ``JobSpec``.

The dataclasses below are the schema; docs/job-file.md documents them. ``load_job`` is the
only entry point; every error it raises names file, line and key path.
"""

from __future__ import annotations

import os
import re
import types
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping, Union

from clusterddp import validate
from clusterddp.affinity import Mode as CpuAffinity
from clusterddp.errors import JobSpecError
from clusterddp.sections.code import CodeSpec
from clusterddp.sections.container import ContainerSpec
from clusterddp.sections.kubernetes import KubernetesSpec
from clusterddp.sections.openpai import OpenPAISpec
from clusterddp.sections.slurm import SlurmSpec
from clusterddp.sections.ssh import SSHSpec
from clusterddp.specload import INTERNAL, NodeReader, check, check_each, compose
from clusterddp.validate import (env_name_problem, host_problem, module_problem, node_range_problem,
                                 non_negative_problem, path_problem, port_problem, positive_seconds_problem,
                                 seconds_problem, shown, signal_problem, text_problem, token_problem, workers_problem)

NprocPerNode = Union[int, Literal["auto", "gpu", "cpu"]]
#: Kept for callers that build names; the rule itself is ``validate.token_problem`` (fullmatch).
NAME_PATTERN = validate.TOKEN
COMMAND_LINE = "<command line>"


def _nproc(value: NprocPerNode) -> str | None:
    return workers_problem(value) if isinstance(value, int) else None


def _rank(value: int) -> str | None:
    return None if 0 <= value < validate.MAX_NODES * validate.MAX_WORKERS_PER_NODE else f"not a rank: {value}"


def _hang_timeout(value: float | str) -> str | None:
    return None if isinstance(value, str) else positive_seconds_problem(value)


def _names(problem: Any) -> Any:
    """A check over a whole list or mapping of names: the first bad name's problem."""
    def checker(value: Any) -> str | None:
        for name in value:
            found: str | None = problem(name)
            if found:
                return found
        return None
    return checker


@dataclass(frozen=True)
class MasterSpec:
    """Where rank 0's TCP store listens; filled in by the cluster environment when absent."""

    addr: str | None = field(default=None, metadata=check(host_problem))
    port: int | None = field(default=None, metadata=check(port_problem))


@dataclass(frozen=True)
class LogsSpec:
    """Per-rank log files and what the console shows."""

    dir: str = field(default="logs", metadata=check(path_problem))
    ranks: tuple[int, ...] | None = field(default=None, metadata=check_each(_rank))
    prefix: bool = True
    #: Identical lines of several ranks within a short window shown once on the console.
    merge: bool = True


def _exception_problem(value: str) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_]\w{0,99}", value):
        return None
    return f"expected an exception class name like FileNotFoundError, got {shown(str(value))}"


@dataclass(frozen=True)
class RestartOnSpec:
    """Which failures ``restarts`` retries (launch/restart/verdict.py). By default a failure that will
    repeat is not: SyntaxError, ImportError, NameError, a missing file, an assert, exit 2
    (argparse) before any step completed, or the same exception at the same place as the
    attempt before with no step in between; on SLURM, a step that failed to launch on every
    node the same way as the attempt before (templates/slurm.sbatch)."""

    #: True: retry those too (every failure is restarted, as before clusterddp judged them).
    deterministic: bool = False
    #: Exception class names retried even before any step (a data mount that comes late:
    #: FileNotFoundError).
    always: tuple[str, ...] = field(default=(), metadata=check_each(_exception_problem))
    #: Exception class names never retried, even after progress (ValueError: a bad config).
    never: tuple[str, ...] = field(default=(), metadata=check_each(_exception_problem))


@dataclass(frozen=True)
class JobSpec:
    """A validated job. Paths are kept as written; ``base_dir`` is where relative ones start."""

    name: str = field(default="job", metadata=check(token_problem))
    script: str | None = field(default=None, metadata=check(path_problem))
    module: str | None = field(default=None, metadata=check(module_problem))
    args: tuple[str, ...] = field(default=(), metadata=check_each(text_problem))
    #: A count, or ``"MIN:MAX"`` (torchrun's ``--nnodes``): an elastic job starts on as many
    #: healthy hosts as it finds, at least MIN and at most MAX, and again on every restart.
    nodes: Union[int, str] = field(default=1, metadata=check(node_range_problem))
    nproc_per_node: NprocPerNode = field(default="auto", metadata=check(_nproc))
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    #: CPUs of each worker (clusterddp.affinity): the cores of its GPU's NUMA node, split
    #: between the workers sharing it; disjoint shares on CPU-only nodes; ``none``: unbound.
    cpu_affinity: CpuAffinity = "auto"
    #: As torchrun's --virtual-local-rank: each worker sees only its own GPU, as cuda:0, and
    #: LOCAL_RANK=0 (CUDA_VISIBLE_DEVICES=<its GPU>), so it cannot touch a neighbour's GPU.
    virtual_local_rank: bool = False
    env: dict[str, str] = field(default_factory=dict, metadata=check(_names(env_name_problem)))
    #: Names of the launcher's variables every worker gets (secrets: WANDB_API_KEY, HF_TOKEN):
    #: copied by name at start, over SSH too, ``--export``-ed by name into sbatch; the value is
    #: never written to a job file, a rendered script, a dry run or a log.
    env_passthrough: tuple[str, ...] = field(default=(), metadata=check_each(env_name_problem))
    workdir: str | None = field(default=None, metadata=check(path_problem))
    python: str | None = field(default=None, metadata=check(path_problem))
    master: MasterSpec = field(default_factory=MasterSpec)
    restarts: int = field(default=0, metadata=check(non_negative_problem))
    restart_on: RestartOnSpec = field(default_factory=RestartOnSpec)
    grace_period: float = field(default=5.0, metadata=check(seconds_problem))
    forward_signals: tuple[str, ...] = field(default=("SIGUSR1", "SIGUSR2"), metadata=check_each(signal_problem))
    #: Seconds without progress before a hang is declared, or "auto": learnt from the steps
    #: (clusterddp.hang.StepBudget, docs/diagnose.md).
    hang_timeout: Union[float, Literal["auto"], None] = field(default=None, metadata=check(_hang_timeout))
    #: Fork the workers of every attempt from one interpreter per node that imported torch
    #: (launch/start/warm.py): ``auto`` when the entry imports torch itself or ``preload`` is given.
    warm_start: Union[bool, Literal["auto"]] = "auto"
    #: Modules that interpreter imports besides torch (``[torchvision]``); none may start a
    #: thread or CUDA (then every worker starts cold, with one line saying why).
    preload: tuple[str, ...] = field(default=(), metadata=check_each(module_problem))
    logs: LogsSpec = field(default_factory=LogsSpec)
    #: ``clusterddp run`` returns once every rank runs; the launcher goes on in its own
    #: session, its console in ``logs/<run-id>/console.log`` (``clusterddp attach``,
    #: docs/runs.md). Local runs only, for now.
    detach: bool = False
    ssh: SSHSpec = field(default_factory=SSHSpec)
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    openpai: OpenPAISpec = field(default_factory=OpenPAISpec)
    kubernetes: KubernetesSpec = field(default_factory=KubernetesSpec)
    #: The image the job runs in on every target (docs/containers.md); absent: bare processes.
    container: ContainerSpec = field(default_factory=ContainerSpec)
    #: The code tree the SSH head ships to every host (sections/code.py); absent: shared paths.
    code: CodeSpec = field(default_factory=CodeSpec)
    #: Set by load_job, not by the YAML: the file it came from and its directory.
    source: str | None = field(default=None, compare=False, metadata={INTERNAL: True})
    base_dir: str = field(default=".", compare=False, metadata={INTERNAL: True})
    key_lines: Mapping[str, int] = field(default_factory=dict, compare=False, metadata={INTERNAL: True})
    #: Keys a flag set (``{"python": "--python"}``): messages about them name the flag.
    given_by: Mapping[str, str] = field(default_factory=dict, compare=False, metadata={INTERNAL: True})

    @property
    def node_range(self) -> tuple[int, int]:
        """``nodes`` as (MIN, MAX); equal for a fixed count."""
        return validate.parse_node_range(self.nodes)

    @property
    def elastic(self) -> bool:
        """``nodes: "MIN:MAX"``: the hosts (and so the node count) are chosen at each (re)start,
        from candidates that may outnumber MAX (spares in a hostfile)."""
        return isinstance(self.nodes, str) and ":" in self.nodes

    def where(self, key: str) -> str:
        """``file:line: key`` for messages about a value after loading (``key`` dotted); the
        flag's name when a flag set it."""
        if key in self.given_by:
            return self.given_by[key]
        if self.source is None:
            return f"{COMMAND_LINE}: {key}"
        line = self.line_of(key)
        return f"{self.source}:{line}: {key}" if line else f"{self.source}: {key}"

    def line_of(self, key: str) -> int | None:
        """The job-file line of ``key`` (``ssh.hosts[2]``, ``env.A``), else of the nearest key
        that holds it (``slurm.extra_sbatch`` for a value the loader did not see); None for a
        job that was not loaded from a file."""
        while key:
            line = self.key_lines.get(key)
            if line:
                return line
            cut = max(key.rfind("["), key.rfind("."))
            key = key[:cut] if cut > 0 else ""
        return None

    def placed(self, error: JobSpecError) -> JobSpecError:
        """``error`` with its key's line when it has none: checks after loading (renderers,
        the environment) name the key, and this job remembers where each key was."""
        if error.line is not None or not error.key or self.source is None:
            return error
        line = self.line_of(error.key)
        return error.at_line(line) if line else error

    def entry_argv(self) -> list[str]:
        """What follows the interpreter: ``script args`` or ``-m module args``."""
        if self.module:
            return ["-m", self.module, *self.args]
        if self.script is None:
            raise JobSpecError(self.source or "<command line>", None, "script",
                               "nothing to run", "give 'script:' or 'module:' in the job file, "
                               "or a script after '--'")
        return [self.script_path(), *self.args]

    def script_path(self) -> str:
        """The script, relative paths taken from the job file's directory."""
        assert self.script is not None
        if os.path.isabs(self.script) or self.source is None:
            return self.script
        return os.path.normpath(os.path.join(self.base_dir, self.script))

    def code_dir(self) -> str | None:
        """``code.dir`` as an absolute path (relative ones from the job file's directory)."""
        if self.code.dir is None:
            return None
        return os.path.abspath(os.path.join(self.base_dir, os.path.expanduser(self.code.dir)))

    def with_overrides(self, **changes: Any) -> "JobSpec":
        """A copy with CLI overrides applied (values of None are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def load_job(path: str | os.PathLike[str], job_dir: str | None = None) -> JobSpec:
    """Read, validate and type one job file; raise JobSpecError naming file:line: key.

    The file is read through ``validate.read_small_file`` (a regular file of at most
    MAX_JOB_FILE_BYTES), so /dev/zero, a FIFO or a directory is one line, not a hang.
    ``job_dir`` is where relative paths start instead of the file's own directory: a
    Kubernetes pod reads the job file from a ConfigMap, away from the checkout it names."""
    where = str(path)
    if validate.control_problem(where) or len(where) > 4096:
        raise JobSpecError(shown(where), None, "", "the job file's path " +
                           (validate.control_problem(where) or "is too long"))
    text = _read_job_text(where)
    node = compose(where, text)
    reader = NodeReader(where)
    spec: JobSpec = reader.build(JobSpec, node)
    if spec.script and spec.module:
        raise reader.fail(node, "script", "give either 'script' or 'module', not both")
    if not spec.script and not spec.module:
        raise reader.fail(node, "script", "missing what to run", "add 'script: train.py' or 'module: pkg.train'")
    _check_container_image(where, node, reader, spec.container)
    name = spec.name if "name" in _keys(node) else _default_name(where)
    base_dir = os.path.abspath(job_dir) if job_dir is not None else os.path.dirname(os.path.abspath(where))
    spec = replace(spec, name=name, source=where, base_dir=base_dir, key_lines=types.MappingProxyType(reader.lines))
    if spec.script and not os.path.isfile(spec.script_path()):
        line = _line_of(node, "script")
        raise JobSpecError(where, line, "script", f"no such file: {shown(spec.script_path(), 200)}")
    return spec


def _check_container_image(where: str, node: object, reader: NodeReader, container: ContainerSpec) -> None:
    """A ``container:`` given without an image is refused: it would otherwise render as bare
    processes (``container: {image: null}`` once gave a bare SLURM job), silently dropping the
    image the user asked for. The line is the ``image:`` key's when one was written."""
    if "container" not in _keys(node) or container.image is not None:
        return
    line = reader.lines.get("container.image") or _line_of(node, "container")
    raise JobSpecError(where, line, "container.image", "missing: a container needs an image",
                       "add 'image:' (a registry image, a squashfs/SIF file, or an OCI bundle directory), "
                       "or drop 'container:' to run bare processes")


def _read_job_text(where: str) -> str:
    """The job file's text: a regular UTF-8 file of bounded size, or one line saying why not."""
    try:
        data = validate.read_small_file(where, validate.MAX_JOB_FILE_BYTES)
    except FileNotFoundError:
        raise JobSpecError(where, None, "", "no such job file") from None
    except ValueError as exc:
        raise JobSpecError(where, None, "", f"the job file {exc}") from None
    except OSError as exc:
        raise JobSpecError(where, None, "", f"cannot read the job file: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise JobSpecError(where, line, "", f"not UTF-8 text (byte {data[exc.start]:#04x})",
                           "a job file is YAML text in UTF-8") from None


def job_from_command(command: list[str]) -> JobSpec:
    """A job for ``clusterddp run [flags] -- train.py args``: torchrun style, no file.

    The command passes the same rules as a job file's ``script``/``module``/``args``."""
    if not command:
        raise JobSpecError(COMMAND_LINE, None, "", "nothing to run",
                           "give a job file, or a script after '--'")
    if command[0] == "-m":
        if len(command) < 2:
            raise JobSpecError(COMMAND_LINE, None, "module", "'-m' needs a module name")
        _check_command("module", command[1], module_problem)
        job = JobSpec(name="cli", module=command[1], args=tuple(command[2:]))
    else:
        _check_command("script", command[0], path_problem)
        job = JobSpec(name=_default_name(command[0]), script=command[0], args=tuple(command[1:]))
    for index, arg in enumerate(job.args):
        _check_command(f"args[{index}]", arg, text_problem)
    return job


def _check_command(key: str, value: str, problem_of: Any) -> None:
    problem = problem_of(value)
    if problem:
        raise JobSpecError(COMMAND_LINE, None, key, problem)


def _keys(node: object) -> set[str]:
    return {k.value for k, _ in getattr(node, "value", [])}


def _line_of(node: object, key: str) -> int | None:
    for key_node, _ in getattr(node, "value", []):
        if key_node.value == key:
            return int(key_node.start_mark.line) + 1
    return None


def _default_name(path: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(path).stem)[:64] or "job"
    return stem if token_problem(stem) is None else "job-" + stem
