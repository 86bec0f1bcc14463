"""SLURM hostlists (``n[01-04],gpu[1,3]``) and task layouts (``2(x3),1``), expanded in Python.

Why not ``scontrol show hostnames``: it is often missing inside containers, and on an
invalid list it prints an error yet exits 0. So the launcher expands lists itself, following
SLURM's own parser (src/common/hostlist.c) rule by rule:

- Tokens are separated by comma, space, tab or newline, except inside ``[...]``, where commas
  separate ranges and spaces belong to the number.
- A range ``lo-hi`` is printed with the width of the text of ``lo``: ``n[009-11]`` gives
  n009 n010 n011, ``n[1-010]`` gives n1 .. n10, and ``[ 100-101]`` gives 0100 0101.
- Order and duplicates are kept (a hostlist, not a hostset).
- With several bracket groups in one token the last group varies fastest, then the groups
  before it from left to right, the next-to-last group slowest: SLURM recurses right to left.
  For two groups that is plain lexicographic order.
- Text after the last ``]`` is a suffix shared by every host (SLURM >= 23.02.5).

Where SLURM is lenient with garbage (``n[1-]``, ``n[1a-3]``, a ``[`` without ``]``, which it
turns into odd host names), this module raises ``HostlistError`` instead: a launcher must
not guess at a node name.
"""

from __future__ import annotations

import itertools
import re

from clusterddp.errors import HostlistError
from clusterddp.validate import shown

#: Characters that separate hosts at the top level of a hostlist.
SEPARATORS = ", \t\n"
#: SLURM refuses a single range of more hosts than this (MAX_RANGE in hostlist.c).
MAX_RANGE = 64 * 1024
#: Upper bound on one token's expansion, so ``a[0-65535]b[0-65535]`` fails instead of
#: eating the node's memory.
MAX_HOSTS = 1024 * 1024

#: A bound: digits, optionally after blanks (which count towards the width, as in SLURM).
_BOUND = re.compile(r"^[ \t\n]*[0-9]+$")
_TASKS = re.compile(r"^([0-9]+)(?:\(x([0-9]+)\))?$")


def expand_hostlist(text: str, limit: int = MAX_HOSTS) -> list[str]:
    """Every host of a SLURM hostlist, in SLURM's order, duplicates kept.

    ``expand_hostlist("n[1,5-7],login")`` -> ``["n1", "n5", "n6", "n7", "login"]``.
    An empty or blank list gives ``[]``. Raises HostlistError naming the bad part, or when the
    list has more than ``limit`` hosts in all (checked before each token is expanded).
    """
    hosts: list[str] = []
    for token in _tokens(text):
        hosts.extend(_expand_token(token, text, limit - len(hosts)))
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE``-style counts per node: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _TASKS.fullmatch(part.strip())
        if match is None:
            raise HostlistError(f"invalid tasks-per-node list {shown(text)}: bad entry {shown(part)}",
                                "expected entries like '2' or '2(x3)' separated by commas")
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat < 1:
            raise HostlistError(f"invalid tasks-per-node list {shown(text)}: repeat count in {shown(part)} is 0")
        counts.extend([count] * repeat)
    return counts


def _tokens(text: str) -> list[str]:
    """Split at top-level separators; separators inside brackets belong to the token."""
    tokens: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"invalid hostlist {shown(text)}: nested '['")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"invalid hostlist {shown(text)}: ']' without '['")
        if depth == 0 and char in SEPARATORS:
            if current:
                tokens.append("".join(current))
                current = []
            continue
        current.append(char)
    if depth != 0:
        raise HostlistError(f"invalid hostlist {shown(text)}: '[' without ']'")
    if current:
        tokens.append("".join(current))
    return tokens


def _expand_token(token: str, text: str, limit: int = MAX_HOSTS) -> list[str]:
    """One token: literal text and bracket groups, expanded in SLURM's nesting order."""
    parts = re.split(r"\[([^\]]*)\]", token)
    literals = parts[0::2]  # text between groups: len(groups) + 1 pieces
    groups = [_parse_group(group, token, text) for group in parts[1::2]]
    total = 1
    for values in groups:
        total *= len(values)
    if total > min(limit, MAX_HOSTS):
        raise HostlistError(f"invalid hostlist {shown(text)}: {shown(token)} expands to {total} hosts, "
                            f"more than the {max(limit, 0)} left of the limit")
    if not groups:
        return [token]
    # SLURM's order (it recurses from the right): the next-to-last group is the outermost
    # loop, then each group to its left, and the last group varies fastest.
    last = len(groups) - 1
    order = [*range(last - 1, -1, -1), last]
    hosts = []
    for combination in itertools.product(*(groups[i] for i in order)):
        chosen = dict(zip(order, combination))
        pieces = [literals[0]]
        for index in range(len(groups)):
            pieces.append(chosen[index])
            pieces.append(literals[index + 1])
        hosts.append("".join(pieces))
    return hosts


def _parse_group(group: str, token: str, text: str) -> list[str]:
    """The numbers of one ``[...]`` group, formatted with each range's width."""
    numbers: list[str] = []
    for item in group.split(","):
        low_text, dash, high_text = item.partition("-")
        if not _BOUND.fullmatch(low_text) or (dash and not _BOUND.fullmatch(high_text)):
            raise HostlistError(f"invalid hostlist {shown(text)}: bad range {shown(item)} in {shown(token)}",
                                "ranges look like 'n[1-4]', 'n[01,07-09]'")
        low = int(low_text)
        high = int(high_text) if dash else low
        if low > high:
            raise HostlistError(f"invalid hostlist {shown(text)}: reversed range {shown(item)} in {shown(token)}")
        if high - low + 1 > MAX_RANGE:
            raise HostlistError(f"invalid hostlist {shown(text)}: range {shown(item)} has more than {MAX_RANGE} hosts")
        width = len(low_text)
        numbers.extend(f"{n:0{width}d}" for n in range(low, high + 1))
    return numbers
