"""The ``code:`` section: the tree the SSH head ships to every host (docs/ssh.md, "Shipping
the code"). Absent (``dir`` unset): the hosts are assumed to see the head's files at the
same paths (a shared filesystem), as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from clusterddp.specload import check, check_each
from clusterddp.validate import path_problem

#: ``code.max_mb``'s default: a code tree, not a data set (a 4 GB checkpoint is refused).
DEFAULT_MAX_MB = 1024.0


def _max_mb(value: float) -> str | None:
    if not math.isfinite(value) or value <= 0:
        return f"must be a positive number of MiB, got {value}"
    return None


@dataclass(frozen=True)
class CodeSpec:
    """What is shipped, and where the hosts keep it."""

    #: The tree to ship, relative to the job file (``.``: the job file's directory); None:
    #: nothing is shipped.
    dir: str | None = field(default=None, metadata=check(path_problem))
    #: gitignore-style patterns left home besides each directory's ``.gitignore``.
    exclude: tuple[str, ...] = field(default=(), metadata=check_each(path_problem))
    #: The size guard: a tree over this many MiB is refused, naming its biggest entries.
    max_mb: float = field(default=DEFAULT_MAX_MB, metadata=check(_max_mb))
    #: Each host's content-addressed cache (``~``: that host's home); None: ~/.cache/clusterddp/code.
    cache: str | None = field(default=None, metadata=check(path_problem))
