"""Job file -> OpenPAI protocol-v2 job (``templates/openpai.yaml``): a pure function.

Every value goes through ``yaml_scalar`` so what OpenPAI parses is exactly what the job file
said (a command with ``: `` or a ``#`` stays one string, a name like ``yes`` stays a string).
The result passes the REST server's JSON schema and its prerequisite checks; values that
would fail there fail here, naming the job-file key.
"""

from __future__ import annotations

import re
import shlex
from string import Template
from typing import Mapping

import yaml

from clusterddp import __version__
from clusterddp.errors import JobSpecError
from clusterddp.sections.openpai import JOB_NAME_PATTERN
from clusterddp.spec import JobSpec
from clusterddp.templates import load_template

TEMPLATE = "openpai.yaml"
#: Strings that may stay unquoted: no YAML indicator, no ': ', no '#', no ',' (flow maps).
_PLAIN = re.compile(r"^[A-Za-z_/](?:[A-Za-z0-9_ ./=+@-]*[A-Za-z0-9_./=+@-])?$")
#: Characters a double-quoted YAML scalar must escape beyond '"' and '\'.
_LINE_BREAKS = {"\u0085", "\u2028", "\u2029", "\ufeff"}


def render_openpai(job: JobSpec, job_path: str, name: str | None = None) -> str:
    """The protocol-v2 YAML that runs ``clusterddp run job_path`` on ``job.nodes`` instances.

    ``job_path`` is the job file as the task's shell will find it (relative to the directory
    the setup lines leave it in); ``name`` overrides ``openpai.name`` / the job's name.
    """
    spec = job.openpai
    where = job.source or job_path
    if "\n" in job_path or "\r" in job_path:
        raise JobSpecError(where, None, "", "the job file's path contains a line break")
    if not spec.image:
        raise JobSpecError(where, None, "openpai.image", "required to render an OpenPAI job",
                           "add 'openpai: {image: <docker image with torch and clusterddp>}'")
    job_name = name or spec.name or job.name
    if not JOB_NAME_PATTERN.match(job_name):
        key = "name" if name is None and spec.name is None else "openpai.name"
        raise JobSpecError(where, None, key,
                           f"{job_name!r} is not a valid OpenPAI job name (letters, digits, '_', '-')",
                           "set openpai.name, or pass --name")
    _check_gpus(job, where)
    for index, line in enumerate(spec.setup):
        problem = chain_problem(line)
        if problem:
            raise JobSpecError(where, None, f"openpai.setup[{index}]", problem,
                               "OpenPAI runs the commands as one line joined with ' && '")
    commands = [*spec.setup, f"clusterddp run {shlex.quote(job_path)}"]
    values = {
        "version": __version__,
        "job_file": shlex.quote(job_path),
        "name": yaml_scalar(job_name),
        "job_retry_count": str(spec.job_retry_count),
        "image": yaml_scalar(spec.image),
        "parameters": flow_mapping(spec.parameters),
        "task_role": spec.task_role,
        "instances": str(job.nodes),
        "task_retry_count": str(spec.task_retry_count),
        "cpu": str(spec.cpu),
        "memory_mb": str(spec.memory_mb),
        "gpu": str(spec.gpu),
        "port_label": spec.port_label,
        "shm_mb": str(spec.shm_mb),
        "commands": "\n".join(f"      - {yaml_scalar(line)}" for line in commands),
        "virtual_cluster": yaml_scalar(spec.virtual_cluster),
    }
    try:
        return Template(load_template(TEMPLATE)).substitute(values)
    except (KeyError, ValueError) as exc:
        raise JobSpecError(where, None, "openpai",
                           f"template {TEMPLATE} needs a value the renderer does not give: {exc}") from None


def _check_gpus(job: JobSpec, where: str) -> None:
    """A GPU job must ask OpenPAI for GPUs: otherwise the container has none and nccl fails."""
    gpu, nproc = job.openpai.gpu, job.nproc_per_node
    if gpu == 0 and (job.backend == "nccl" or nproc == "gpu"):
        why = "backend is nccl" if job.backend == "nccl" else "nproc_per_node is 'gpu'"
        raise JobSpecError(where, None, "openpai.gpu", f"is 0 but the {why}",
                           "set openpai.gpu to the GPUs per instance")
    if gpu > 0 and isinstance(nproc, int) and nproc > gpu and job.backend != "gloo":
        raise JobSpecError(where, None, "openpai.gpu",
                           f"{gpu} GPUs per instance for nproc_per_node {nproc}: one GPU per worker",
                           f"set openpai.gpu to {nproc}, or nproc_per_node to {gpu}")


def chain_problem(line: str) -> str | None:
    """Why ``line`` cannot be followed by `` && next``, or None when it can.

    The REST server joins a task role's commands with `` && `` into one shell line, so a
    ``#`` comment would swallow ``clusterddp run`` and a trailing ``&`` or ``;`` is a syntax error.
    """
    quote = ""
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t;|&()"):
            return "has a '#' comment, which would also comment out the commands after it"
    if quote:
        return f"has an unclosed {quote} quote"
    stripped = line.rstrip()
    if not stripped:
        return "is empty"
    if escaped or stripped.endswith(("&", ";", "|", "\\")):
        return f"ends with {stripped[-1]!r}: it must be a complete command"
    return None


def yaml_scalar(value: str) -> str:
    """``value`` as a YAML scalar that reads back as the same string in YAML 1.1 and 1.2."""
    if _PLAIN.match(value) and yaml.safe_load(value) == value:
        return value
    out = ['"']
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable() and char not in _LINE_BREAKS:
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


def flow_mapping(values: Mapping[str, str]) -> str:
    """``{k: v, ...}`` on one line (``{}`` when empty), keys and values as safe scalars."""
    return "{" + ", ".join(f"{yaml_scalar(k)}: {yaml_scalar(v)}" for k, v in values.items()) + "}"
