"""Job file -> OpenPAI protocol-v2 job (``templates/openpai.yaml``): a pure function.

Every value goes through ``quoting.yaml_scalar`` so what OpenPAI parses is exactly what the job file
said (a command with ``: `` or a ``#`` stays one string, a name like ``yes`` stays a string).
The result passes the REST server's JSON schema and its prerequisite checks, and the
FrameworkController object the server makes of it; values that would fail there fail here,
naming the job-file key (and its line).

Retries (docs/openpai.md, "Fault tolerance"): ``restarts: N`` is ``jobRetryCount: N``, a retry
of the whole job (every task, new pods, new ports); ``taskRetryCount`` is always 0, since the
REST server ignores it under gang allocation (k8s.js generateTaskRole) and a task retried alone
could not rejoin the others. ``nodes: "MIN:MAX"`` with MIN < MAX is refused: a task role runs
exactly ``instances`` tasks, gang-allocated, on every attempt.
"""

from __future__ import annotations

from string import Template
from typing import Mapping

from clusterddp import __version__
from clusterddp.errors import JobSpecError
from clusterddp.schedulers import quoting as q
from clusterddp.schedulers.quoting import flow_mapping, yaml_scalar
from clusterddp.sections.openpai import IDENTIFIER_PATTERN, JOB_NAME_PATTERN, docker_image_problem
from clusterddp.spec import JobSpec
from clusterddp.templates import load_template
from clusterddp.validate import one_line_problem, shown, text_problem

TEMPLATE = "openpai.yaml"
#: FrameworkController's bounds on the Framework the REST server creates from the spec:
#: ``RetryPolicySpec.MaxRetryCount`` is an int32 (types.go), ``taskNumber`` at most 10000 (crd.go).
MAX_RETRY_COUNT = (1 << 31) - 1
MAX_INSTANCES = 10000


def render_openpai(job: JobSpec, job_path: str, name: str | None = None) -> str:
    """The protocol-v2 YAML that runs ``clusterddp run job_path`` on ``job.nodes`` instances.

    ``job_path`` is the job file as the task's shell will find it (relative to the directory
    the setup lines leave it in); ``name`` overrides ``openpai.name`` / the job's name. A
    refusal names the job file's line of the key at fault (``JobSpec.placed``).
    """
    try:
        return _render(job, job_path, name)
    except JobSpecError as exc:
        raise job.placed(exc) from None


def _render(job: JobSpec, job_path: str, name: str | None) -> str:
    spec = job.openpai
    where = q.place(job.source, job_path)
    job_word = _job_word(job_path, where)
    image = job.container.image
    if not isinstance(image, str) or not image:
        raise JobSpecError(where, None, "container.image", "required to render an OpenPAI job",
                           "add 'container: {image: <docker image with torch>}'")
    if docker_image_problem(image):
        raise JobSpecError(where, job.key_lines.get("container.image"), "container.image",
                           f"{docker_image_problem(image)}: OpenPAI runs a Docker image")
    job_name = name or spec.name or job.name
    if not isinstance(job_name, str) or not JOB_NAME_PATTERN.fullmatch(job_name):
        key = "name" if name is None and spec.name is None else "openpai.name"
        raise JobSpecError(where, None, key,
                           f"{shown(job_name)} is not a valid OpenPAI job name (letters, digits, '_', '-')",
                           "set openpai.name, or pass --name")
    for key, value in (("openpai.task_role", spec.task_role), ("openpai.port_label", spec.port_label)):
        if not isinstance(value, str) or not IDENTIFIER_PATTERN.fullmatch(value):
            raise JobSpecError(where, None, key, f"must be letters, digits and '_', got {shown(value)}")
    _check_gpus(job, where)
    for index, line in enumerate(spec.setup):
        problem = (one_line_problem(line) if isinstance(line, str) else "is not a string") or chain_problem(line)
        if problem:
            raise JobSpecError(where, None, f"openpai.setup[{index}]", problem,
                               "OpenPAI runs the commands as one line joined with ' && '")
    commands = [*spec.setup, f"clusterddp run {job_word}"]
    values = {
        "version": __version__,
        "job_file": job_word,
        "name": yaml_scalar(job_name),
        "job_retry_count": _job_retry_count(job, where),
        "image": _scalar(image, where, "container.image"),
        "parameters": _parameters(spec.parameters, where),
        "task_role": yaml_scalar(spec.task_role),  # "False", "null", "yes" are identifiers too
        "instances": _instances(job, where),
        "cpu": q.integer(spec.cpu, where, "openpai.cpu", minimum=1),
        "memory_mb": q.integer(spec.memory_mb, where, "openpai.memory_mb", minimum=1),
        "gpu": q.integer(spec.gpu, where, "openpai.gpu"),
        "port_label": yaml_scalar(spec.port_label),
        "shm_mb": q.integer(spec.shm_mb, where, "openpai.shm_mb", minimum=1),
        "commands": "\n".join(f"      - {yaml_scalar(line)}" for line in commands),
        "virtual_cluster": _scalar(spec.virtual_cluster, where, "openpai.virtual_cluster"),
    }
    try:
        return Template(load_template(TEMPLATE)).substitute(values)
    except (KeyError, ValueError) as exc:
        raise JobSpecError(where, None, "openpai",
                           f"template {TEMPLATE} needs a value the renderer does not give: {exc}") from None


def _job_retry_count(job: JobSpec, where: str) -> str:
    """``restarts`` as ``jobRetryCount``: an integer 0..MAX_RETRY_COUNT (an int32 in the Framework)."""
    line = job.key_lines.get("restarts")
    value = job.restarts
    if type(value) is not int or not 0 <= value <= MAX_RETRY_COUNT:
        raise JobSpecError(where, line, "restarts", f"must be an integer from 0 to {MAX_RETRY_COUNT}, got "
                           f"{shown(value)}", "it is OpenPAI's jobRetryCount: retries of the whole job")
    return str(value)


def _instances(job: JobSpec, where: str) -> str:
    """``nodes`` as the task role's ``instances``: a fixed count, at most MAX_INSTANCES.

    ``"MIN:MAX"`` with MIN < MAX cannot be rendered: OpenPAI starts exactly ``instances`` tasks
    per role, all gang-allocated before any runs, and a retry asks for the same count again
    (``completion.minSucceededInstances`` only says when a job has succeeded). ``"N:N"`` is N.
    """
    line = job.key_lines.get("nodes")
    low, high = q.node_range(job, where)
    if low != high:
        raise JobSpecError(where, line, "nodes", f"{shown(job.nodes)}: OpenPAI runs a fixed number of instances "
                           "per task role, all started together, on every retry too",
                           f"write nodes: {high} (and restarts: N to retry the whole job), or run the "
                           "elastic job over SSH with a hostfile")
    if high > MAX_INSTANCES:
        raise JobSpecError(where, line, "nodes", f"{high} instances: OpenPAI's FrameworkController takes at "
                           f"most {MAX_INSTANCES} per task role")
    return str(high)


def _job_word(job_path: str, where: str) -> str:
    """The job path as a shell word; one line (it is in the header comments too), and without
    ``<%``, which OpenPAI's runtime would expand as a template before the shell sees it."""
    word = q.path_word(job_path, where, "job file path")
    if "<%" in job_path:
        raise JobSpecError(where, None, "job file path", "contains '<%', which OpenPAI expands as a template")
    return word


def _scalar(value: object, where: str, key: str) -> str:
    """A string value as an exact YAML scalar; text OpenPAI cannot hold is refused."""
    if not isinstance(value, str):
        raise JobSpecError(where, None, key, f"must be a string, got {type(value).__name__}")
    problem = text_problem(value)
    if problem:
        raise JobSpecError(where, None, key, problem)
    return yaml_scalar(value)


def _parameters(values: Mapping[str, str], where: str) -> str:
    for key, value in values.items():
        _scalar(key, where, "openpai.parameters")
        _scalar(value, where, f"openpai.parameters.{key}")
    return flow_mapping(values)


def _check_gpus(job: JobSpec, where: str) -> None:
    """A GPU job must ask OpenPAI for GPUs: otherwise the container has none and nccl fails."""
    gpu, nproc = job.openpai.gpu, job.nproc_per_node
    q.integer(gpu, where, "openpai.gpu")
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
