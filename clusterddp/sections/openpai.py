"""The ``openpai:`` section: what goes into the rendered protocol-v2 job (see docs/openpai.md).

Names are checked here, at load time, against the patterns the OpenPAI REST server enforces,
so a bad task role or port label is reported as ``jobs/x.yaml:12: openpai.task_role: ...``
instead of as a 400 from the server after the upload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from clusterddp.specload import check, check_each
from clusterddp.validate import non_negative_problem, positive_problem, setup_line_problem, shown

#: OpenPAI's job-name pattern (protocol.js: ``^[a-zA-Z0-9_-]+$``, at most 255 characters).
JOB_NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,255}")
#: Task-role keys and port labels (protocol.js: ``^[a-zA-Z_][a-zA-Z0-9_]*$``).
IDENTIFIER_PATTERN = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,127}")
#: A Docker image reference: [registry[:port]/]name[:tag][@digest], no blanks.
IMAGE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}")
#: Port labels the REST server adds to every task role itself; a second one would clash.
RESERVED_PORT_LABELS = ("ssh", "http")


def _job_name(value: str) -> str | None:
    if JOB_NAME_PATTERN.fullmatch(value):
        return None
    return f"OpenPAI job names use letters, digits, '_' and '-' (at most 255), got {shown(value)}"


def _identifier(value: str) -> str | None:
    if IDENTIFIER_PATTERN.fullmatch(value):
        return None
    return f"must be letters, digits and '_', not starting with a digit (no '-'), got {shown(value)}"


def _port_label(value: str) -> str | None:
    if value in RESERVED_PORT_LABELS:
        return f"{shown(value)} is reserved: OpenPAI adds the ports 'ssh' and 'http' to every task itself"
    return _identifier(value)


def docker_image_problem(value: str) -> str | None:
    """OpenPAI runs Docker images: ``container.image`` must be a Docker reference there."""
    if IMAGE_PATTERN.fullmatch(value):
        return None
    return f"not a Docker image reference: {shown(value)}"


def _parameter_names(value: dict[str, str]) -> str | None:
    for name in value:
        problem = _identifier(name)
        if problem:
            return f"parameter name {problem}"
    return None


@dataclass(frozen=True)
class OpenPAISpec:
    """Task role and resources of the OpenPAI job; never holds secrets.

    The token used to submit comes from the environment or a token file, never from here:
    job files are committed and shared. Retries are the job's ``restarts`` (jobRetryCount);
    a task role's taskRetryCount is always 0 (docs/openpai.md, "Fault tolerance").
    """

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "job_retry_count": "write the job's top-level 'restarts: N': it renders as jobRetryCount",
        "task_retry_count": "removed: OpenPAI ignores taskRetryCount under gang allocation, and a task "
                            "retried alone could not rejoin the job; use the top-level 'restarts'",
        "image": "moved to the job-level 'container: {image: ...}', which every target reads",
    }

    #: OpenPAI job name (unique per user); default the job's ``name``.
    name: str | None = field(default=None, metadata=check(_job_name))
    virtual_cluster: str = field(default="default", metadata=check(_identifier))
    task_role: str = field(default="worker", metadata=check(_identifier))
    #: The port label whose task-0 port becomes MASTER_PORT.
    port_label: str = field(default="SynPort", metadata=check(_port_label))
    cpu: int = field(default=4, metadata=check(positive_problem))
    memory_mb: int = field(default=8192, metadata=check(positive_problem))
    #: GPUs per instance; 0 is a CPU job (gloo on the CPU slots).
    gpu: int = field(default=0, metadata=check(non_negative_problem))
    #: /dev/shm size; 512 is OpenPAI's own default, DataLoader workers often need more.
    shm_mb: int = field(default=512, metadata=check(positive_problem))
    #: Shell lines run before ``clusterddp run`` (install, cd into the checkout...).
    setup: tuple[str, ...] = field(default=(), metadata=check_each(setup_line_problem))
    #: OpenPAI ``parameters:``, usable in setup lines as ``<% $parameters.NAME %>``.
    parameters: dict[str, str] = field(default_factory=dict, metadata=check(_parameter_names))
