"""Identical console lines of several ranks shown once (issue 26, goal 5)."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from clusterddp.launch.merge import LineMerger, Source, parse_label, ranks_label
from clusterddp.launch.ssh.io import Console, RemoteLauncher
from tests.conftest import cli, cli_env, wait_for, write_job


def _merger(expected: int, window: float = 0.5) -> tuple[LineMerger, list[bytes]]:
    out: list[bytes] = []

    def render(stderr: bool, text: bytes, sources: list[Source]) -> bytes:  # type: ignore[type-arg]
        return f"[{ranks_label(sources)}] ".encode() + text

    return LineMerger(render, lambda data, stderr: out.append(data), expected, window), out


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


def test_line_of_one_rank_goes_out_when_the_window_ends() -> None:
    """A line no other rank repeats goes out as it came once the window ends, with nothing else
    happening (how soon: benchmarks, not a test on a loaded machine)."""
    merger, out = _merger(expected=4, window=0.2)
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
