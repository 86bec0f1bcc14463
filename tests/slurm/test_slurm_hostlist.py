"""Hostlist and tasks-per-node expansion, against SLURM's own rules (reference/slurm.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from clusterddp.errors import HostlistError
from clusterddp.hostlist import expand_hostlist, expand_tasks_per_node

EXPANSIONS = [
    ("", []),
    ("  \n", []),
    ("n1", ["n1"]),
    ("login-01", ["login-01"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[1,5-7]", ["n1", "n5", "n6", "n7"]),
    ("n[01-03]", ["n01", "n02", "n03"]),
    ("n[009-011]", ["n009", "n010", "n011"]),
    ("n[009-11]", ["n009", "n010", "n011"]),  # width comes from the low bound
    ("n[1-010]", [f"n{i}" for i in range(1, 11)]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[5]", ["n5"]),
    ("[1-2]", ["1", "2"]),
    ("tux[2,1-2]", ["tux2", "tux1", "tux2"]),  # order and duplicates kept
    ("b,a,b", ["b", "a", "b"]),
    ("alpha beta,gamma", ["alpha", "beta", "gamma"]),
    ("a\tb\nc", ["a", "b", "c"]),
    ("a,,b", ["a", "b"]),
    (" n[1-2] , m3 ", ["n1", "n2", "m3"]),
    ("n[1-2],gpu[01-02]", ["n1", "n2", "gpu01", "gpu02"]),
    ("rack[0-1]_blade[0-1]", ["rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"]),
    ("a[1-2]b[1-2]c[1-2]",
     ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"]),
    ("a[1-2]b[1-2]c[1-2]d[1-2]",
     ["a1b1c1d1", "a1b1c1d2", "a2b1c1d1", "a2b1c1d2", "a1b2c1d1", "a1b2c1d2", "a2b2c1d1", "a2b2c1d2",
      "a1b1c2d1", "a1b1c2d2", "a2b1c2d1", "a2b1c2d2", "a1b2c2d1", "a1b2c2d2", "a2b2c2d1", "a2b2c2d2"]),
    ("1.2.3.[089, 100-101]", ["1.2.3.089", "1.2.3.0100", "1.2.3.0101"]),  # a blank widens
    ("node[0001-0002]-int", ["node0001-int", "node0002-int"]),  # suffix, SLURM >= 23.02.5
    ("gpu-a100-[01-02].ib.cluster", ["gpu-a100-01.ib.cluster", "gpu-a100-02.ib.cluster"]),
    ("n[1-2]m", ["n1m", "n2m"]),
    ("compute-b2[1,2]", ["compute-b21", "compute-b22"]),
    ("n[0-0]", ["n0"]),
]

MALFORMED = [
    ("n[3-1]", "reversed"),
    ("n[]", "bad range"),
    ("n[1-]", "bad range"),  # SLURM reads this as n1; a launcher must not guess
    ("n[-2]", "bad range"),
    ("n[1--2]", "bad range"),
    ("n[a-b]", "bad range"),
    ("n[1a-3]", "bad range"),  # SLURM silently gives n01..n03
    ("n[1-2", "'[' without ']'"),
    ("n]", "']' without '['"),
    ("n[1[2]]", "nested"),
    ("n[1,,2]", "bad range"),
    ("n[0-70000]", "more than"),
    ("a[0-2000]b[0-2000]", "expands to"),
]

TASKS = [
    ("1", [1]),
    ("2(x3),1", [2, 2, 2, 1]),
    ("4(x2)", [4, 4]),
    ("1,2,3", [1, 2, 3]),
    (" 2(x2) ", [2, 2]),
]

BAD_TASKS = ["", "x", "2(x)", "2(3)", "2(x0)", "-1", "2,,1", "2(x2"]


@pytest.mark.parametrize("text,hosts", EXPANSIONS)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    """Each hostlist expands to SLURM's hosts in SLURM's order."""
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text,fragment", MALFORMED)
def test_malformed_hostlist(text: str, fragment: str) -> None:
    """A malformed hostlist raises HostlistError that quotes the list and says what is wrong."""
    with pytest.raises(HostlistError) as info:
        expand_hostlist(text)
    assert fragment in str(info.value)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("text,counts", TASKS)
def test_expand_tasks_per_node(text: str, counts: list[int]) -> None:
    """SLURM_TASKS_PER_NODE's '(xN)' repetition expands per node, in node order."""
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", BAD_TASKS)
def test_bad_tasks_per_node(text: str) -> None:
    """A malformed tasks-per-node list raises HostlistError."""
    with pytest.raises(HostlistError):
        expand_tasks_per_node(text)


#: Text after the last ']' of a token: a suffix, which SLURM accepts only since 23.02.5.
SUFFIX = re.compile(r"\][^\[\],\s]+(?=[,\s]|$)")


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol (slurm-client) is not installed")
def test_matches_scontrol(tmp_path) -> None:
    """Every valid vector SLURM 22.05 understands expands exactly as 'scontrol show hostnames' does."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hostlisttest\nSlurmctldHost=localhost\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    checked = 0
    for text, hosts in EXPANSIONS:
        if "[" not in text or SUFFIX.search(text):
            continue  # plain names need no check; 22.05 rejects suffixes after ']'
        out = subprocess.run(["scontrol", "show", "hostnames", text], env=env, capture_output=True,
                             text=True, timeout=30, check=False)
        assert out.stdout.split() == hosts, (text, out.stderr)
        checked += 1
    assert checked >= 10
