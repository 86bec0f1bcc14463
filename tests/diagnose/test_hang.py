"""Hang detection as plain data: progress times, stall, and who holds the others."""

from __future__ import annotations

import os
import time
from pathlib import Path

from clusterddp.hang import RankLife, culprit, last_progress, stalled_for
from clusterddp.stackreport import RankWhere


def _where(in_collective: bool) -> RankWhere:
    return RankWhere(summary="in x", key=(), in_collective=in_collective)


def test_no_life_yet_is_never_a_hang() -> None:
    """Before any rank printed or beat (imports), there is no stall to measure."""
    assert stalled_for({0: None, 1: None}, now=1000.0) is None


def test_stall_counts_from_the_latest_sign_of_life() -> None:
    """The job is stalled for as long as the most recently active rank has been silent."""
    assert stalled_for({0: 100.0, 1: 104.0, 2: None}, now=110.0) == 6.0


def test_heartbeat_file_counts_as_progress(tmp_path: Path) -> None:
    """A touched heartbeat file is progress even without a printed line; an old one is not."""
    beat = tmp_path / "rank0.heartbeat"
    since = time.monotonic() - 600.0  # the touch below falls after it however loaded the machine
    beat.touch()
    progress = last_progress([RankLife(0, 0.0, str(beat)), RankLife(1, 0.0, str(tmp_path / "none"))], since)
    assert progress[0] is not None and since < progress[0] <= time.monotonic() + 1.0
    assert progress[1] is None
    old = time.time() - 3600
    os.utime(beat, (old, old))
    assert last_progress([RankLife(0, 0.0, str(beat))], since)[0] is None


def test_culprit_is_the_rank_outside_the_collective() -> None:
    """Ranks waiting in all_reduce are victims; the one elsewhere is named."""
    where = {0: _where(True), 1: _where(True), 2: _where(True), 3: _where(False)}
    assert culprit({}, where) == "rank(s) 3 not in a collective while rank(s) 0-2 wait in one"


def test_all_waiting_here_points_to_another_node() -> None:
    """When every local rank waits in a collective, the holder is elsewhere."""
    assert "on another node" in culprit({}, {0: _where(True), 1: _where(True)})


def test_without_stacks_the_first_to_stop_is_named() -> None:
    """No stack told us anything: name the ranks whose progress stopped first."""
    assert culprit({0: 10.0, 1: 20.0, 2: 10.2}, {}) == "rank(s) 0,2 stopped first"


def test_a_rank_that_never_printed_counts_from_the_start() -> None:
    """Given the attempt's start, a rank with no sign of life is stalled since then (its peers may have exited)."""
    assert stalled_for({0: None}, now=110.0, since=100.0) == 10.0
    assert stalled_for({0: None, 1: 105.0}, now=110.0, since=100.0) == 5.0
