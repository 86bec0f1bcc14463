"""Hostfiles: which hosts a job fans out to, and how many workers each takes.

Accepted, one host per line, so files written for other launchers work unchanged::

    # comment (also after an entry)
    node1                       plain: slots come from nproc_per_node
    node2 slots=4               DeepSpeed / Open MPI
    node3 slots=4 max_slots=8   Open MPI (max_slots is accepted and ignored)
    node4:4                     Horovod / mpirun -H
    admin@node5 slots=2         user for this host only
    [fe80::1%eth0]:2            IPv6 in brackets when slots follow

``parse_hostfile`` is pure (text in, entries out) and raises ``HostlistError`` naming
``file:line``; ``select_hosts`` applies include/exclude patterns.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence, Tuple, Union

from clusterddp.errors import HostlistError
from clusterddp.validate import MAX_HOSTFILE_BYTES, control_problem, read_small_file, shown, workers_problem

#: Host names and addresses: DNS labels, IPv4, ``user@`` prefix; IPv6 only inside brackets.
_HOST = re.compile(r"(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{0,63})@)?"
                   r"(?P<host>\[[0-9A-Fa-f:.%A-Za-z]{2,60}\]|[A-Za-z0-9_][A-Za-z0-9_.-]{0,252})")
_SLOT_KEYS = ("slots", "max_slots", "max-slots")
#: Slots on one host, as workers per node: the same bound (raised by the same variable).
_SLOTS = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class HostEntry:
    """One hostfile line: the host as written (an ssh_config alias or an address)."""

    host: str
    slots: int | None = None
    user: str | None = None
    #: Where it came from, for messages: ``hosts.txt:3`` or ``jobs/x.yaml: ssh.hosts[2]``.
    origin: str = ""


def parse_hostfile(text: str, path: str) -> list[HostEntry]:
    """Parse a hostfile's text; ``path`` is only used to name ``file:line`` in errors.

    Lines end at '\n' only (``str.splitlines`` would also split at U+2028 or NEL and so
    accept a host hidden after one); any other control character in a line is an error."""
    entries: list[HostEntry] = []
    seen: dict[str, str] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        where = f"{path}:{number}"
        raw = raw[:-1] if raw.endswith("\r") else raw
        problem = control_problem(raw.replace("\t", " "))
        if problem:
            raise HostlistError(f"{where}: the line {problem}", "one host per line: 'host', 'host slots=N' or 'host:N'")
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        entry = parse_host_spec(line, where)
        if entry.host in seen:
            raise HostlistError(f"{where}: host {shown(entry.host)} is listed twice (first at {seen[entry.host]})",
                                "give each host once, with slots=N for several workers")
        seen[entry.host] = where
        entries.append(entry)
    return entries


def parse_host_spec(spec: str, where: str) -> HostEntry:
    """One entry: ``host``, ``host slots=N``, ``host:N``, optionally ``user@host``."""
    problem = control_problem(spec.replace("\t", " ")) or ("is over 1024 characters" if len(spec) > 1024 else None)
    if problem or not spec.strip():
        raise HostlistError(f"{where}: {shown(spec)}: {problem or 'is empty'}",
                            "expected 'host', 'host slots=N' or 'host:N'")
    words = spec.split()
    first, options = words[0], words[1:]
    slots: int | None = None
    if first.startswith("[") or "]" in first:
        address, bracket, count = first.partition("]")
        if not bracket or (count and not count.startswith(":")):
            raise HostlistError(f"{where}: {shown(first)}: expected '[address]' or '[address]:N'")
        if count:
            slots = _slots(count[1:], where, first)
        first = address + "]"
    elif first.count(":") == 1:
        first, _, count = first.partition(":")
        slots = _slots(count, where, f"{first}:{count}")
    elif ":" in first:
        raise HostlistError(f"{where}: {shown(first)}: write IPv6 addresses in brackets, e.g. [{first[:60]}]:2")
    match = _HOST.fullmatch(first)
    if not match:
        raise HostlistError(f"{where}: {shown(first)} is not a host name or address",
                            "host names are letters, digits, '.', '-', '_' (not starting with '-')")
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in _SLOT_KEYS:
            raise HostlistError(f"{where}: unknown option {shown(option)}",
                                "expected 'host', 'host slots=N' or 'host:N'")
        if key == "slots":
            if slots is not None:
                raise HostlistError(f"{where}: slots given twice")
            slots = _slots(value, where, option)
        else:
            _slots(value, where, option)
    host = match.group("host")
    if host.startswith("["):
        host = host[1:-1]
    return HostEntry(host=host, slots=slots, user=match.group("user"), origin=where)


def read_hostfile(path: str | Path) -> list[HostEntry]:
    """Read and parse a hostfile; a missing or empty file is an error naming it."""
    name = str(path)
    if control_problem(name) or len(name) > 4096:
        raise HostlistError(f"{shown(name)}: the hostfile's path " + (control_problem(name) or "is too long"))
    try:
        data = read_small_file(name, MAX_HOSTFILE_BYTES)
    except FileNotFoundError:
        raise HostlistError(f"{name}: no such hostfile") from None
    except ValueError as exc:
        raise HostlistError(f"{name}: the hostfile {exc}") from None
    except OSError as exc:
        raise HostlistError(f"{name}: cannot read the hostfile: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise HostlistError(f"{name}:{line}: not UTF-8 text (byte {data[exc.start]:#04x})",
                            "one host per line: 'host', 'host slots=N' or 'host:N'") from None
    entries = parse_hostfile(text, name)
    if not entries:
        raise HostlistError(f"{name}: no hosts in the hostfile")
    return entries


def entries_from_list(specs: Sequence[str], origin: str, places: Sequence[str] = ()) -> list[HostEntry]:
    """Entries from a list of specs (the job file's ``ssh.hosts``), same syntax as a line.

    ``places[i]`` names where spec i was written (``jobs/x.yaml:7: ssh.hosts[2]``); without
    it, ``origin[i]``."""
    entries: list[HostEntry] = []
    seen: dict[str, str] = {}
    for index, spec in enumerate(specs):
        where = places[index] if index < len(places) else f"{origin}[{index}]"
        if not spec.strip() or control_problem(spec.replace("\t", " ")) or "#" in spec:
            raise HostlistError(f"{where}: {shown(spec)}: expected one host per entry ('host', 'host slots=N', 'host:N')")
        entry = parse_host_spec(spec.strip(), where)
        if entry.host in seen:
            raise HostlistError(f"{where}: host {shown(entry.host)} is listed twice (first at {seen[entry.host]})")
        seen[entry.host] = where
        entries.append(entry)
    return entries


#: A host pattern and where it was given: the flag (``--include``) or ``file:line: key``.
Pattern = Union[str, Tuple[str, str]]


def select_hosts(entries: Sequence[HostEntry], include: Iterable[Pattern] = (),
                 exclude: Iterable[Pattern] = ()) -> list[HostEntry]:
    """Keep hosts matching any ``include`` pattern (all when none), drop any ``exclude`` match.

    Patterns are shell globs (``node[1-4]``, ``gpu*``); each may also be a comma-separated
    list, and may come as ``(pattern, where)`` (a plain one came from ``--include`` /
    ``--exclude``). A pattern that matches no host is an error naming where it was given: it
    is almost always a typo, and a silently ignored exclusion would start a job on a host the
    user meant to avoid.
    """
    includes, excludes = _patterns(include, "--include"), _patterns(exclude, "--exclude")
    names = [e.host for e in entries]
    for pattern, where in includes + excludes:
        if not fnmatch.filter(names, pattern):
            place = where if where.startswith("--") else f"{where}:"
            raise HostlistError(f"{place} {shown(pattern)} matches no host", "hosts: " + shown(", ".join(names), 200))
    kept = [e for e in entries
            if (not includes or any(fnmatch.fnmatchcase(e.host, p) for p, _ in includes))
            and not any(fnmatch.fnmatchcase(e.host, p) for p, _ in excludes)]
    if not kept:
        raise HostlistError("include/exclude left no host to run on")
    return kept


def _patterns(values: Iterable[Pattern], flag: str) -> list[tuple[str, str]]:
    """(pattern, where) for each glob of each comma list; a plain string came from ``flag``."""
    pairs = [(value, flag) if isinstance(value, str) else value for value in values]
    return [(p.strip(), where) for value, where in pairs for p in value.split(",") if p.strip()]


def _slots(value: str, where: str, written: str) -> int:
    if not _SLOTS.fullmatch(value) or int(value) < 1:
        raise HostlistError(f"{where}: {shown(written)}: slots must be a whole number >= 1")
    problem = workers_problem(int(value))
    if problem:
        raise HostlistError(f"{where}: {shown(written)}: slots: {problem}")
    return int(value)
