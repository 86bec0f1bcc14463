"""The job file: one YAML document -> one frozen, typed ``JobSpec``.

The dataclasses below are the schema; docs/job-file.md documents them. ``load_job`` is the
only entry point; every error it raises names file, line and key path.
"""

from __future__ import annotations

import os
import re
import signal
import types
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping, Union

from clusterddp.errors import JobSpecError
from clusterddp.sections.openpai import OpenPAISpec
from clusterddp.sections.slurm import SlurmSpec
from clusterddp.sections.ssh import SSHSpec
from clusterddp.specload import INTERNAL, NodeReader, check, compose
from clusterddp.validate import env_name_problem

NprocPerNode = Union[int, Literal["auto", "gpu", "cpu"]]
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _name(value: str) -> str | None:
    if NAME_PATTERN.match(value):
        return None
    return f"must match {NAME_PATTERN.pattern} (letters, digits, '_', '.', '-'), got {value!r}"


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def _non_negative(value: float) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def _port(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"port must be 1-65535, got {value}"


def _nproc(value: NprocPerNode) -> str | None:
    if isinstance(value, int) and value < 1:
        return f"must be >= 1, got {value}"
    return None


def _signals(value: tuple[str, ...]) -> str | None:
    for name in value:
        if not hasattr(signal, name) or not name.startswith("SIG"):
            return f"unknown signal {name!r} (use names like SIGUSR1)"
    return None


def _env_names(value: dict[str, str]) -> str | None:
    for name in value:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            return f"invalid environment variable name {name!r}"
    return None


def _passthrough_names(value: tuple[str, ...]) -> str | None:
    for name in value:
        problem = env_name_problem(name)
        if problem:
            return problem
    return None


@dataclass(frozen=True)
class MasterSpec:
    """Where rank 0's TCP store listens; filled in by the cluster environment when absent."""

    addr: str | None = None
    port: int | None = field(default=None, metadata=check(_port))


@dataclass(frozen=True)
class LogsSpec:
    """Per-rank log files and what the console shows."""

    dir: str = "logs"
    ranks: tuple[int, ...] | None = None
    prefix: bool = True


@dataclass(frozen=True)
class JobSpec:
    """A validated job. Paths are kept as written; ``base_dir`` is where relative ones start."""

    name: str = field(default="job", metadata=check(_name))
    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    nodes: int = field(default=1, metadata=check(_positive))
    nproc_per_node: NprocPerNode = field(default="auto", metadata=check(_nproc))
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    env: dict[str, str] = field(default_factory=dict, metadata=check(_env_names))
    #: Names of the launcher's variables every worker gets (secrets: WANDB_API_KEY, HF_TOKEN):
    #: copied by name at start, over SSH too, ``--export``-ed by name into sbatch; the value is
    #: never written to a job file, a rendered script, a dry run or a log.
    env_passthrough: tuple[str, ...] = field(default=(), metadata=check(_passthrough_names))
    workdir: str | None = None
    python: str | None = None
    master: MasterSpec = field(default_factory=MasterSpec)
    restarts: int = field(default=0, metadata=check(_non_negative))
    grace_period: float = field(default=5.0, metadata=check(_non_negative))
    forward_signals: tuple[str, ...] = field(default=("SIGUSR1", "SIGUSR2"), metadata=check(_signals))
    hang_timeout: float | None = field(default=None, metadata=check(_positive))
    logs: LogsSpec = field(default_factory=LogsSpec)
    ssh: SSHSpec = field(default_factory=SSHSpec)
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    openpai: OpenPAISpec = field(default_factory=OpenPAISpec)
    #: Set by load_job, not by the YAML: the file it came from and its directory.
    source: str | None = field(default=None, compare=False, metadata={INTERNAL: True})
    base_dir: str = field(default=".", compare=False, metadata={INTERNAL: True})
    key_lines: Mapping[str, int] = field(default_factory=dict, compare=False, metadata={INTERNAL: True})

    def where(self, key: str) -> str:
        """``file:line: key`` for messages about a value after loading (``key`` dotted)."""
        if self.source is None:
            return f"<command line>: {key}"
        line = self.key_lines.get(key)
        return f"{self.source}:{line}: {key}" if line else f"{self.source}: {key}"

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

    def with_overrides(self, **changes: Any) -> "JobSpec":
        """A copy with CLI overrides applied (values of None are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def load_job(path: str | os.PathLike[str]) -> JobSpec:
    """Read, validate and type one job file; raise JobSpecError naming file:line: key."""
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobSpecError(shown, None, "", "no such job file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobSpecError(shown, None, "", f"cannot read the job file: {exc}") from None
    node = compose(shown, text)
    reader = NodeReader(shown)
    spec: JobSpec = reader.build(JobSpec, node)
    if spec.script and spec.module:
        raise reader.fail(node, "script", "give either 'script' or 'module', not both")
    if not spec.script and not spec.module:
        raise reader.fail(node, "script", "missing what to run", "add 'script: train.py' or 'module: pkg.train'")
    name = spec.name if "name" in _keys(node) else _default_name(shown)
    base_dir = os.path.dirname(os.path.abspath(shown))
    spec = replace(spec, name=name, source=shown, base_dir=base_dir, key_lines=types.MappingProxyType(reader.lines))
    if spec.script and not os.path.isfile(spec.script_path()):
        line = _line_of(node, "script")
        raise JobSpecError(shown, line, "script", f"no such file: {spec.script_path()}")
    return spec


def job_from_command(command: list[str]) -> JobSpec:
    """A job for ``clusterddp run [flags] -- train.py args``: torchrun style, no file."""
    if not command:
        raise JobSpecError("<command line>", None, "", "nothing to run",
                           "give a job file, or a script after '--'")
    if command[0] == "-m":
        if len(command) < 2:
            raise JobSpecError("<command line>", None, "module", "'-m' needs a module name")
        return JobSpec(name="cli", module=command[1], args=tuple(command[2:]))
    return JobSpec(name=_default_name(command[0]), script=command[0], args=tuple(command[1:]))


def _keys(node: object) -> set[str]:
    return {k.value for k, _ in getattr(node, "value", [])}


def _line_of(node: object, key: str) -> int | None:
    for key_node, _ in getattr(node, "value", []):
        if key_node.value == key:
            return key_node.start_mark.line + 1
    return None


def _default_name(path: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(path).stem) or "job"
    return stem if NAME_PATTERN.match(stem) else "job-" + stem
