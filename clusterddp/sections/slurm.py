"""The ``slurm:`` section: what goes into the rendered sbatch script (see docs/slurm.md).

Values are checked here, at load time, against the formats sbatch accepts, so a typo is a
``jobs/x.yaml:12: slurm.time: ...`` line on the login node instead of a job that sits in the
queue and then fails, or an option sbatch silently reads differently.
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import dataclass, field

from clusterddp.specload import check, check_each
from clusterddp.validate import line_problem, non_negative_problem, positive_problem, setup_line_problem, shown

#: sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch.1).
TIME = re.compile(r"(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})")
#: sbatch --mem: a number with an optional K/M/G/T unit (megabytes without one).
MEM = re.compile(r"\d+[KMGT]?")
#: sbatch --signal: [{R|B}:]<sig_name>[@sig_time]; only names, so the batch shell can trap it.
SIGNAL = re.compile(r"(?:([RB]{1,2}):)?(?:SIG)?([A-Z][A-Z0-9]*)(?:@(\d+))?")
#: One option value on an #SBATCH line: sbatch splits those lines at blanks.
OPTION_VALUE = re.compile(r"[^\s'\"]+")
#: One extra sbatch option: ``--name`` or ``--name=value`` (or ``-X value``), one line.
EXTRA_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(?:[= ][^\s].*)?")


def _matches(pattern: re.Pattern[str], example: str):  # type: ignore[no-untyped-def]
    def checker(value: str) -> str | None:
        if len(value) <= 64 and pattern.fullmatch(value):
            return None
        return f"invalid value {shown(value)} (expected e.g. {example})"
    return checker


def _option(value: str) -> str | None:
    if len(value) <= 4096 and OPTION_VALUE.fullmatch(value) and not line_problem(value) and value[0] != "-":
        return None
    return f"invalid value {shown(value)}: must be non-empty, one word without blanks, quotes, control characters or a leading '-'"


def _signal(value: str) -> str | None:
    match = SIGNAL.fullmatch(value) if len(value) <= 64 else None
    if match is None:
        return f"invalid value {shown(value)} (expected [B:]NAME[@SECONDS], e.g. B:USR1@90)"
    if not isinstance(getattr(signals, "SIG" + match.group(2), None), signals.Signals):
        return f"unknown signal {shown(match.group(2))} in {shown(value)} (use a name such as USR1 or TERM)"
    return None


def _extra(line: str) -> str | None:
    option = line.strip()
    if option.startswith("#SBATCH"):
        option = option[len("#SBATCH"):].strip()
    if line_problem(line, 4096) or not EXTRA_OPTION.fullmatch(option):
        return f"invalid sbatch option {shown(line)} (expected one option on one line, e.g. '--mail-type=END')"
    return None


def signal_name(spec: str) -> str:
    """The signal's name without 'SIG' (``"B:USR1@90"`` -> ``"USR1"``), for the shell's trap."""
    match = SIGNAL.fullmatch(spec)
    if match is None:
        raise ValueError(f"invalid signal spec {spec!r}")
    return match.group(2)


def signals_batch_shell(spec: str) -> bool:
    """True when ``--signal`` goes to the batch shell (``B:``), which then forwards it."""
    match = SIGNAL.fullmatch(spec)
    return bool(match and match.group(1) and "B" in match.group(1))


@dataclass(frozen=True)
class SlurmSpec:
    """sbatch options; ``nodes`` comes from the job's top-level ``nodes``."""

    partition: str | None = field(default=None, metadata=check(_option))
    gpus_per_node: int | None = field(default=None, metadata=check(non_negative_problem))
    cpus_per_task: int | None = field(default=None, metadata=check(positive_problem))
    mem: str | None = field(default=None, metadata=check(_matches(MEM, "'64G' or '4000'")))
    time: str | None = field(default=None, metadata=check(_matches(TIME, "'4:00:00' or '1-12:00:00'")))
    account: str | None = field(default=None, metadata=check(_option))
    qos: str | None = field(default=None, metadata=check(_option))
    constraint: str | None = field(default=None, metadata=check(_option))
    exclusive: bool = False
    #: Batch output/error paths (sbatch patterns such as %j allowed); default logs.dir/%x-%j.out.
    output: str | None = field(default=None, metadata=check(_option))
    error: str | None = field(default=None, metadata=check(_option))
    #: Requeue the job when the workers exit with 75 (preempted, checkpoint saved).
    requeue: bool = True
    #: sbatch --signal; null sends none. B: sends it to the batch shell, which forwards it.
    signal: str | None = field(default="B:USR1@90", metadata=check(_signal))
    extra_sbatch: tuple[str, ...] = field(default=(), metadata=check_each(_extra))
    #: Shell lines run in the batch script before the launcher (module load, venv activate).
    setup: tuple[str, ...] = field(default=(), metadata=check_each(setup_line_problem))
