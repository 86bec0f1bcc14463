"""The ``container:`` section: the image the job runs in, on every target (docs/containers.md).

A container is a property of the job, not of one scheduler (TorchX's ``Role.image``): SLURM
renders it as pyxis flags, an Apptainer command or an OCI bundle; OpenPAI as the task's image.
Values are checked here, at load time, against what the runtimes accept, so ``host:ctr`` with
a comma or a relative path is a ``jobs/x.yaml:12: container.mounts[0]: ...`` line instead of a
step that pyxis splits into two wrong mounts on every node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Optional

from clusterddp.specload import check, check_each
from clusterddp.validate import env_name_problem, line_problem, shown

#: The runtimes a SLURM job can use; ``None`` means the target's default (pyxis on SLURM).
Runtime = Literal["pyxis", "apptainer", "oci"]
RUNTIMES: tuple[str, ...] = ("pyxis", "apptainer", "oci")
#: An image: a registry reference (``nvcr.io#nvidia/pytorch:24.05-py3``, ``docker://x``), a
#: squashfs/SIF file or an OCI bundle directory. No blanks, quotes, ',' or control characters:
#: pyxis and Apptainer split their flag values at ','.
IMAGE = re.compile(r"[A-Za-z0-9./_~][A-Za-z0-9._/:@#+~=-]{0,1023}")
#: Flags a mount part may carry after ``host:container``.
MOUNT_FLAGS = ("ro", "rw")
#: Characters no part of a mount may hold: pyxis splits ``--container-mounts`` at ',' and each
#: entry at ':'; Apptainer's ``--bind`` does the same.
MOUNT_SEPARATORS = ",:"
#: Files an image is given as, which pyxis reads as a registry name unless the path starts
#: with '/' or './' (pyxis issue 127).
SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")


def image_problem(value: str) -> str | None:
    """An image reference or path, one word that every runtime's flag parser keeps whole."""
    if IMAGE.fullmatch(value) and ".." not in value.split("/"):
        return None
    return (f"not an image reference or path: {shown(value)} (letters, digits and ./_~:@#+=-, "
            "no blanks, quotes, ',' or '..' parts)")


def path_part_problem(value: str, what: str) -> str | None:
    """An absolute path that survives a ``SRC:DST:FLAGS,...`` list: no ',' or ':' inside."""
    problem = line_problem(value, 4096)
    if problem:
        return f"{what} {problem}"
    if not value.startswith("/"):
        return f"{what} must be an absolute path, got {shown(value)}"
    bad = next((c for c in MOUNT_SEPARATORS if c in value), None)
    if bad is not None:
        return f"{what} {shown(value)} holds {bad!r}, which the runtimes read as a separator"
    if any(part == ".." for part in value.split("/")):
        return f"{what} {shown(value)} has a '..' part"
    return None


def parse_mount(value: str) -> tuple[str, str, str | None]:
    """``/host:/ctr[:ro]`` -> (host, container, flag or None); ValueError naming the problem."""
    problem = line_problem(value, 8192)
    if problem:
        raise ValueError(problem)
    parts = value.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"expected HOST:CONTAINER or HOST:CONTAINER:ro, got {shown(value)}")
    host, target = parts[0], parts[1]
    flag = parts[2] if len(parts) == 3 else None
    for what, part in (("the host path", host), ("the container path", target)):
        found = path_part_problem(part, what)
        if found:
            raise ValueError(found)
    if flag is not None and flag not in MOUNT_FLAGS:
        raise ValueError(f"unknown mount flag {shown(flag)} (use 'ro' or 'rw')")
    return host, target, flag


def mount_problem(value: str) -> str | None:
    try:
        parse_mount(value)
    except ValueError as exc:
        return str(exc)
    return None


def workdir_problem(value: str) -> str | None:
    return path_part_problem(value, "the working directory")


@dataclass(frozen=True)
class ContainerSpec:
    """The image every node's launcher and workers run in; absent: bare processes."""

    #: Registry reference, squashfs/SIF file (pyxis, apptainer) or OCI bundle directory (oci).
    image: Optional[str] = field(default=None, metadata=check(image_problem))
    #: ``/host/path:/container/path[:ro]``; the job file's directory, the working directory and
    #: the launcher's zipapp are mounted at their own paths besides these.
    mounts: tuple[str, ...] = field(default=(), metadata=check_each(mount_problem))
    #: Working directory inside the container; default the directory the job was rendered from.
    workdir: Optional[str] = field(default=None, metadata=check(workdir_problem))
    #: pyxis, apptainer or oci; default the target's own (pyxis on SLURM).
    runtime: Optional[Runtime] = None
    #: Names of host variables that must reach the container with the host's value.
    env: tuple[str, ...] = field(default=(), metadata=check_each(env_name_problem))
    #: Mount the user's home directory (pyxis mounts it by default; clusterddp does not).
    mount_home: bool = False
    #: The launcher's zipapp (``clusterddp pack``) on the shared file system; default
    #: ``WORKDIR/.clusterddp/clusterddp-VERSION.pyz``. Mounted read-only at the same path.
    launcher: Optional[str] = field(default=None, metadata=check(lambda v: path_part_problem(v, "the launcher path")))

    @property
    def enabled(self) -> bool:
        return self.image is not None
