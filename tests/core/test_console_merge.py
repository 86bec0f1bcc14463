"""Identical console lines of several ranks shown once (issue 26, goal 5)."""

from __future__ import annotations

import io
import itertools
import random
import threading
from pathlib import Path

import pytest

from clusterddp.launch.observe.merge import LineMerger, Source, parse_label, ranks_label
from clusterddp.launch.ssh.io import Console, RemoteLauncher
from tests.conftest import cli, cli_env, wait_for, write_job


def _merger(expected: int, window: float = 0.5, clock: list[float] | None = None) -> tuple[LineMerger, list[bytes]]:
    """A merger writing ``[h ranks ...] text`` lines to a list; with ``clock``, its time is
    ``clock[0]``, which only the test moves."""
    out: list[bytes] = []

    def render(stderr: bool, text: bytes, sources: list[Source]) -> bytes:  # type: ignore[type-arg]
        return f"[{ranks_label(sources)}] ".encode() + text

    if clock is None:
        return LineMerger(render, lambda data, stderr: out.append(data), expected, window), out
    return LineMerger(render, lambda data, stderr: out.append(data), expected, window, clock=lambda: clock[0]), out


def _per_rank(out: list[bytes]) -> dict[int, list[bytes]]:
    """Each rank's lines as the console shows them, in the console's order."""
    lines: dict[int, list[bytes]] = {}
    for data in out:
        label = parse_label(data + b"\n")
        assert label is not None, data
        for rank in label[1]:
            lines.setdefault(rank, []).append(label[2])
    return lines


def test_sixteen_ranks_same_warning_one_console_line_files_keep_all(job_dir: Path) -> None:
    """16 ranks printing the same lines: far fewer console lines, each log file has every line."""
    job = write_job(job_dir, script="same_warning.py", nproc_per_node=16, args=["2"])
    result = cli("run", str(job), "--run-id", "m16", env=cli_env(CLUSTERDDP_NO_MERGE="0"))
    assert result.returncode == 0, result.stderr
    console = (result.stdout + result.stderr).splitlines()
    assert any(line.startswith(f"[{_host()} ranks ") and line.endswith("epoch 1 done") for line in console)
    assert len(console) < 16 * 6 * 3 // 4
    assert sum(len(p.read_text().splitlines()) for p in (job_dir / "logs" / "m16").glob("rank*.log")) == 16 * 6
    assert sum(f"rank {r} loss" in line for line in console for r in range(16)) == 16 * 2


def test_no_merge_flag_and_variable_show_every_line(job_dir: Path) -> None:
    """--no-merge and CLUSTERDDP_NO_MERGE=1 both give one console line per rank and line."""
    job = write_job(job_dir, script="same_warning.py", nproc_per_node=4, args=["1"])
    for argv, env in ((["--no-merge"], cli_env(CLUSTERDDP_NO_MERGE="0")), ([], cli_env(CLUSTERDDP_NO_MERGE="1"))):
        result = cli("run", str(job), *argv, env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("epoch 0 done") == 4
        assert result.stderr.count("UserWarning: the same for every rank") == 4


def test_bad_no_merge_variable_is_one_line_exit_2(job_dir: Path) -> None:
    """CLUSTERDDP_NO_MERGE=maybe is refused naming the variable."""
    job = write_job(job_dir, script="same_warning.py", nproc_per_node=2)
    result = cli("run", str(job), env=cli_env(CLUSTERDDP_NO_MERGE="maybe"))
    assert result.returncode == 2
    assert "CLUSTERDDP_NO_MERGE: expected 1 or 0" in result.stderr


def test_line_of_one_rank_waits_at_most_the_window() -> None:
    """A line no other rank repeats goes out as it came, once the window has passed (by the
    merger's clock, not a sleep)."""
    clock = [0.0]
    merger, out = _merger(expected=4, window=0.2, clock=clock)
    merger.add(False, "h", (2,), b"only mine")
    clock[0] = 0.19
    merger.release_due()
    assert out == []
    clock[0] = 0.2
    merger.release_due()
    assert out == [b"[h rank 2] only mine"]


def test_held_line_goes_out_without_another_line() -> None:
    """The merger's own thread releases a held line when nothing else happens (no bound on
    how soon: a loaded machine may be slow, the window is what the clock test checks)."""
    merger, out = _merger(expected=4, window=0.05)
    merger.add(False, "h", (2,), b"only mine")
    assert wait_for(lambda: bool(out), timeout=120)
    assert out == [b"[h rank 2] only mine"]


def test_complete_group_goes_out_at_once() -> None:
    """When every expected rank printed the line, it is not held for the window."""
    merger, out = _merger(expected=3, window=30)
    for rank in range(3):
        merger.add(True, "h", (rank,), b"UserWarning: x")
    assert out == [b"[h ranks 0-2] UserWarning: x"]


def test_each_ranks_order_is_kept() -> None:
    """Rank 1's own line before the shared one stays before it; both ranks' lines merge."""
    merger, out = _merger(expected=3, window=30)
    merger.add(False, "h", (0,), b"loss 0")
    merger.add(False, "h", (0,), b"epoch done")
    merger.add(False, "h", (1,), b"loss 1")
    merger.add(False, "h", (1,), b"epoch done")
    merger.add(False, "h", (0,), b"next 0")
    merger.add(False, "h", (1,), b"epoch done")  # a second time: a new group, after "next 0"
    merger.flush()
    assert out == [b"[h rank 0] loss 0", b"[h rank 1] loss 1", b"[h ranks 0-1] epoch done",
                   b"[h rank 0] next 0", b"[h rank 1] epoch done"]


def test_same_line_then_own_line_merges_in_every_interleaving() -> None:
    """Issue 32: each rank prints the same line, then one of its own, twice; in every one of
    the 70 ways two ranks' lines can interleave, both shared lines are merged and each rank's
    lines keep their order (8 lines in, 6 out)."""
    script = {rank: [b"same", b"rank %d step 0" % rank, b"same", b"rank %d step 1" % rank] for rank in (0, 1)}
    for turns in set(itertools.permutations([0] * 4 + [1] * 4)):
        merger, out = _merger(expected=2, clock=[0.0])
        step = {0: 0, 1: 0}
        for rank in turns:
            merger.add(False, "h", (rank,), script[rank][step[rank]])
            step[rank] += 1
        merger.flush()
        assert out.count(b"[h ranks 0-1] same") == 2, (turns, out)
        assert len(out) == 6, (turns, out)
        assert _per_rank(out) == script, (turns, out)


def test_lines_spread_over_the_window_merge() -> None:
    """Under load four ranks' lines arrive spread over 0.45 s, each rank's shared line after
    a line of its own that came after another rank's shared one: all four merge, and each
    rank's lines keep their order."""
    clock = [0.0]
    merger, out = _merger(expected=4, clock=clock)
    arrivals = [(0.00, 0, b"rank 0 starts"), (0.00, 0, b"same"), (0.00, 0, b"rank 0 own"),
                (0.10, 2, b"rank 2 starts"), (0.15, 1, b"rank 1 starts"), (0.15, 1, b"same"),
                (0.30, 2, b"same"), (0.30, 2, b"rank 2 own"), (0.30, 1, b"rank 1 own"),
                (0.45, 3, b"rank 3 starts"), (0.45, 3, b"same"), (0.46, 3, b"rank 3 own")]
    for when, rank, text in arrivals:
        clock[0] = when
        merger.add(False, "h", (rank,), text)
    assert out == [b"[h rank 0] rank 0 starts", b"[h rank 1] rank 1 starts", b"[h rank 2] rank 2 starts",
                   b"[h rank 3] rank 3 starts", b"[h ranks 0-3] same"]
    clock[0] = 0.49
    merger.release_due()
    assert len(out) == 5  # nothing else is due yet
    clock[0] = 0.5
    merger.release_due()
    assert out[5:] == [b"[h rank 0] rank 0 own"]
    clock[0] = 0.96
    merger.release_due()
    assert out[6:] == [b"[h rank 2] rank 2 own", b"[h rank 1] rank 1 own", b"[h rank 3] rank 3 own"]


def test_a_line_past_the_window_is_not_merged() -> None:
    """The same line 0.6 s after the first one's (window 0.5 s) is shown on its own."""
    clock = [0.0]
    merger, out = _merger(expected=3, clock=clock)
    merger.add(False, "h", (0,), b"same")
    clock[0] = 0.6
    merger.add(False, "h", (1,), b"same")
    merger.flush()
    assert out == [b"[h rank 0] same", b"[h rank 1] same"]


def test_a_group_a_rank_must_precede_and_follow_is_not_joined() -> None:
    """Rank 1 printed ``b`` after rank 0's ``a``/``b``: rank 1's ``a`` cannot join rank 0's
    (it would have to come after rank 1's ``b``, which joined the group after rank 0's ``a``)."""
    merger, out = _merger(expected=3, clock=[0.0])
    merger.add(False, "h", (0,), b"a")
    merger.add(False, "h", (0,), b"b")
    merger.add(False, "h", (1,), b"b")
    merger.add(False, "h", (1,), b"a")
    merger.flush()
    assert out == [b"[h rank 0] a", b"[h ranks 0-1] b", b"[h rank 1] a"]


def test_random_interleavings_keep_every_ranks_order() -> None:
    """300 seeded random interleavings of 4 ranks' lines from a small vocabulary, on both
    streams, at random times: every line is shown once, each rank's lines of each stream in
    their order."""
    rng = random.Random(32)
    for _ in range(300):
        script = {rank: [(rng.random() < 0.3, rng.choice([b"a", b"b", b"c", b"own %d" % rank])) for _ in range(8)]
                  for rank in range(4)}
        clock = [0.0]
        merger, out = _merger(expected=rng.choice([4, 5]), window=0.5, clock=clock)
        step = dict.fromkeys(script, 0)
        turns = [rank for rank in script for _ in range(8)]
        rng.shuffle(turns)
        for rank in turns:
            clock[0] += rng.choice([0.0, 0.0, 0.01, 0.2])
            stderr, text = script[rank][step[rank]]
            merger.add(stderr, "h", (rank,), (b"E " if stderr else b"O ") + text)
            step[rank] += 1
        merger.flush()
        for stderr in (False, True):
            mark = b"E " if stderr else b"O "
            shown = _per_rank([data for data in out if data.split(b"] ", 1)[1].startswith(mark)])
            assert shown == {rank: [mark + text for err, text in lines if err == stderr]
                             for rank, lines in script.items() if any(err == stderr for err, _ in lines)}, \
                (script, turns, out)


def test_real_ranks_same_line_then_own_line_merged(job_dir: Path) -> None:
    """Two real workers each print the same line and then one of their own, twice, rank 1
    after rank 0 has printed all four: the console shows both shared lines merged (issue 32:
    the second was shown once per rank)."""
    job = write_job(job_dir, script="same_then_own.py", args=[str(job_dir)])
    result = cli("run", str(job), env=cli_env(CLUSTERDDP_NO_MERGE="0"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    host = _host()
    assert lines.count(f"[{host} ranks 0-1] the same for every rank") == 2, result.stdout
    assert len(lines) == 6, result.stdout
    for rank in (0, 1):
        own = [line for line in lines if line.startswith(f"[{host} rank {rank}] ")]
        assert own == [f"[{host} rank {rank}] rank {rank} step {step}" for step in (0, 1)], result.stdout


def test_merger_under_threads_loses_no_line() -> None:
    """8 threads adding at once: every line is written once, counted by rank."""
    merger, out = _merger(expected=8, window=0.05)
    threads = [threading.Thread(target=lambda r=r: [merger.add(False, "h", (r,), f"l{i % 7}".encode())
                                                    for i in range(500)]) for r in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    merger.flush()
    total = 0
    for data in out:
        label = parse_label(data + b"\n")
        assert label is not None
        total += len(label[1])
    assert total == 8 * 500


@pytest.mark.parametrize("line, parsed", [
    (b"[cdssh1 rank 3] hello\n", ("cdssh1", (3,), b"hello")),
    (b"[cdssh1 ranks 0-2,5] [x] y\n", ("cdssh1", (0, 1, 2, 5), b"[x] y")),
    (b"clusterddp: note\n", None),
    (b"[cdssh1] x\n", None),
    (b"[h ranks 5-2] x\n", None),
])
def test_parse_label(line: bytes, parsed: tuple[str, tuple[int, ...], bytes] | None) -> None:
    """Relayed worker labels are read back; anything else is not a worker line."""
    assert parse_label(line) == parsed


def test_head_merges_across_hosts() -> None:
    """The SSH head shows one line for the same line from ranks on several hosts."""
    out, err = io.BytesIO(), io.BytesIO()
    console = Console(out, err)
    console.merging(4)
    host = RemoteLauncher.__new__(RemoteLauncher)
    host.name = "cdssh1"
    for index in range(4):
        console.relay(host, "err", f"[cdssh{index + 1} rank {index}] UserWarning: x\n".encode())
    console.relay(host, "out", b"[cdssh2 rank 1] mine\n")
    console.flush()
    assert err.getvalue() == b"[ranks 0-3] UserWarning: x\n"
    assert out.getvalue() == b"[cdssh2 rank 1] mine\n"


def _host() -> str:
    import socket

    return socket.gethostname()
