"""Hostfile parsing and host selection: pure functions, table tests."""

from __future__ import annotations

import pytest

from clusterddp.errors import HostlistError
from clusterddp.hostfile import (HostEntry, entries_from_list, parse_hostfile, read_hostfile,
                                 select_hosts)

GOOD = [
    ("node1", [("node1", None, None)]),
    ("node1\nnode2\n", [("node1", None, None), ("node2", None, None)]),
    ("node1 slots=4", [("node1", 4, None)]),
    ("node1 slots=4 max_slots=8", [("node1", 4, None)]),
    ("node1 max-slots=8 slots=2", [("node1", 2, None)]),
    ("node1:4", [("node1", 4, None)]),
    ("10.0.0.5:2", [("10.0.0.5", 2, None)]),
    ("10.0.0.5 slots=2", [("10.0.0.5", 2, None)]),
    ("[fe80::1]:2", [("fe80::1", 2, None)]),
    ("[fe80::1]", [("fe80::1", None, None)]),
    ("admin@node1 slots=2", [("node1", 2, "admin")]),
    ("admin@node1:3", [("node1", 3, "admin")]),
    ("# a comment\n\n   \nnode1  # trailing comment\n", [("node1", None, None)]),
    ("\tnode1\t slots=1 \r\n", [("node1", 1, None)]),
    ("gpu-node_01.cluster.local slots=8", [("gpu-node_01.cluster.local", 8, None)]),
]

BAD = [
    ("node1 slots=0", "hosts.txt:1", "slots must be a whole number >= 1"),
    ("node1 slots=x", "hosts.txt:1", "slots must be"),
    ("node1 slots=-2", "hosts.txt:1", "slots must be"),
    ("node1:", "hosts.txt:1", "slots must be"),
    ("node1:two", "hosts.txt:1", "slots must be"),
    ("\nnode1 gpus=2", "hosts.txt:2", "unknown option 'gpus=2'"),
    ("node1 slots", "hosts.txt:1", "unknown option 'slots'"),
    ("node1 slots=2 slots=3", "hosts.txt:1", "slots given twice"),
    ("node1:2 slots=3", "hosts.txt:1", "slots given twice"),
    ("node1\nnode2\nnode1", "hosts.txt:3", "listed twice (first at hosts.txt:1)"),
    ("fe80::1", "hosts.txt:1", "IPv6 addresses in brackets"),
    ("[fe80::1]x", "hosts.txt:1", "expected '[address]'"),
    ("no$de", "hosts.txt:1", "not a host name"),
    ("node;rm -rf /", "hosts.txt:1", "not a host name"),
    ("-oProxyCommand=x", "hosts.txt:1", "not a host name"),
    ("@node1", "hosts.txt:1", "not a host name"),
]


@pytest.mark.parametrize("text,expected", GOOD)
def test_parse_good(text: str, expected: list[tuple[str, int | None, str | None]]) -> None:
    """Every accepted hostfile dialect gives the same host, slots and user."""
    entries = parse_hostfile(text, "hosts.txt")
    assert [(e.host, e.slots, e.user) for e in entries] == expected


@pytest.mark.parametrize("text,where,message", BAD)
def test_parse_bad(text: str, where: str, message: str) -> None:
    """A malformed line is one error naming file:line and what is wrong."""
    with pytest.raises(HostlistError) as info:
        parse_hostfile(text, "hosts.txt")
    assert str(info.value).startswith(where + ": ")
    assert message in str(info.value)


def test_origin_names_the_line() -> None:
    """Each entry remembers file:line so later errors (preflight) can point back to it."""
    entries = parse_hostfile("# hosts\nnode1\n\nnode2:2\n", "h.txt")
    assert [e.origin for e in entries] == ["h.txt:2", "h.txt:4"]


def test_read_missing_and_empty(tmp_path) -> None:
    """A missing or comment-only hostfile is an error naming the file."""
    with pytest.raises(HostlistError, match="no such hostfile"):
        read_hostfile(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(HostlistError, match=f"{empty}: no hosts"):
        read_hostfile(empty)


def test_entries_from_job_list() -> None:
    """The job file's ssh.hosts uses the hostfile syntax and errors name the list index."""
    entries = entries_from_list(["a", "b slots=2", "c:3"], "job.yaml: ssh.hosts")
    assert [(e.host, e.slots) for e in entries] == [("a", None), ("b", 2), ("c", 3)]
    assert entries[1].origin == "job.yaml: ssh.hosts[1]"
    with pytest.raises(HostlistError, match=r"ssh.hosts\[1\]: .*slots must be"):
        entries_from_list(["a", "b slots=0"], "job.yaml: ssh.hosts")
    with pytest.raises(HostlistError, match=r"ssh.hosts\[2\]: host 'a' is listed twice"):
        entries_from_list(["a", "b", "a:2"], "job.yaml: ssh.hosts")


HOSTS = [HostEntry(h) for h in ("node1", "node2", "node3", "gpu1", "gpu2")]

SELECT = [
    ((), (), ["node1", "node2", "node3", "gpu1", "gpu2"]),
    (("gpu*",), (), ["gpu1", "gpu2"]),
    (("node1,gpu2",), (), ["node1", "gpu2"]),
    ((), ("node[23]",), ["node1", "gpu1", "gpu2"]),
    (("node*",), ("node2",), ["node1", "node3"]),
    (("node1", "node3"), (), ["node1", "node3"]),
]


@pytest.mark.parametrize("include,exclude,expected", SELECT)
def test_select(include: tuple[str, ...], exclude: tuple[str, ...], expected: list[str]) -> None:
    """Include/exclude globs keep the hostfile's order."""
    assert [e.host for e in select_hosts(HOSTS, include, exclude)] == expected


@pytest.mark.parametrize("include,exclude,message", [
    (("nod1",), (), "--include 'nod1' matches no host"),
    ((), ("gpu3",), "--exclude 'gpu3' matches no host"),
    (("gpu1",), ("gpu*",), "left no host"),
])
def test_select_errors(include: tuple[str, ...], exclude: tuple[str, ...], message: str) -> None:
    """A pattern matching nothing is a typo, not a silent no-op."""
    with pytest.raises(HostlistError, match=message.replace("*", r"\*")):
        select_hosts(HOSTS, include, exclude)
