"""Merging stack summaries from several hosts into one report (pure functions, no processes)."""

from __future__ import annotations

from clusterddp.stackreport import HostStacks, merge, summary_in_collective
from clusterddp.launch.ssh.stacks import StacksRound

WAIT = "in all_reduce (distributed_c10d.py:3913) <- main (train.py:24)"
STUCK = "in load_batch (train.py:13) <- main (train.py:21)"


def _host(host: str, ranks: dict[int, str], why: str = "requested") -> HostStacks:
    return HostStacks.from_json({"host": host, "why": why, "ranks": {str(r): s for r, s in ranks.items()},
                                 "full": f"/logs/{host}.txt"}, host=host)


def test_summary_in_collective() -> None:
    """A summary whose innermost frame is torch.distributed's all_reduce counts as waiting."""
    assert summary_in_collective(WAIT)
    assert not summary_in_collective(STUCK)
    assert not summary_in_collective("in all_reduce (mycode.py:3)")  # the user's own function of that name
    assert not summary_in_collective("no stack received (the worker may be inside C code holding the GIL)")


def test_merge_groups_across_hosts_and_flags_the_odd_rank() -> None:
    """Identical summaries on two hosts become one line naming both; the stuck rank comes first."""
    merged = merge([_host("n1", {0: WAIT, 1: WAIT}), _host("n2", {2: WAIT, 3: STUCK}, why="hang")])
    lines = merged.lines()
    assert lines[0] == f"rank 3 (n2): {STUCK}   <- not in a collective: likely holding the others"
    assert lines[1] == f"ranks 0-2 (n1, n2): {WAIT}"
    assert merged.culprit() == "rank(s) 3 on n2 not in a collective while rank(s) 0-2 wait in one"
    assert "n1: /logs/n1.txt" in merged.text("t") and "n2: /logs/n2.txt" in merged.text("t")


def test_explicit_waiting_list_wins_over_the_summary() -> None:
    """A launcher that lists its waiting ranks is believed even when the summary does not say so."""
    stacks = HostStacks.from_json({"ranks": {"0": "in wait_for (futures.py:3)"}, "waiting": [0]}, host="n1")
    assert stacks.waiting == {0}


def test_missing_hosts_are_named() -> None:
    """A host that did not answer in time gets its own line."""
    round_ = StacksRound(why="hang", started=0.0, deadline=2.0, asked=["n1", "n2"], trigger="n2")
    round_.answer(_host("n2", {2: STUCK}, why="hang"))
    assert not round_.finished(1.0, live={"n1", "n2"})
    assert round_.finished(1.0, live={"n2"}) and round_.finished(2.0, live={"n1", "n2"})
    assert round_.merged().lines()[-1].startswith("n1: no answer")
