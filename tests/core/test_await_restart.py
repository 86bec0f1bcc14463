"""A launcher that waits for the head's word after a failed attempt (``--await-restart``): the
words on stdin, a restart in place on the same launcher, an attempt ended from outside, and the
flag's bad use. Real launchers with real workers; the test plays the SSH head on stdin."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from clusterddp.launch.restart.coordinate import Restart, relaid
from clusterddp.protocol import MAX_WORD, RESULT_MARKER, RestartWord, StdinWords, end_attempt_word, restart_word
from clusterddp.topology import Topology
from tests.conftest import cli, cli_env, wait_for, write_job


@pytest.mark.parametrize("chunks, said", [
    ([b"\n\nS\n"], [("stacks", 0, None)]),
    ([b"E3\n"], [("end", 3, None)]),
    ([b"R4 295", b"01\n\n"], [("restart", 4, RestartWord(4, 29501))]),           # a word split across reads
    ([b"\nT"], [("stop", 15, None)]),
    ([b"R1\n", b"E1 2\n", b"R1 99999\n", b"Rx 1\n", b"E\n"], []),  # malformed words are dropped
    ([b"R" + b"9" * 40 + b"\nE2\n"], [("end", 2, None)]),          # an overlong number too, the next one counts
    # a new place: node rank and every node's workers, split anywhere
    ([b"R2 29500 1 2", b",1,1\n"], [("restart", 2, RestartWord(2, 29500, 1, (2, 1, 1)))]),
    ([b"R2 29500 0 1\n"], [("restart", 2, RestartWord(2, 29500, 0, (1,)))]),
    # no such node, a node without workers, an empty or broken list, a missing part, binary
    ([b"R2 29500 3 1,1,1\n", b"R2 29500 0 1,0\n", b"R2 29500 0 \n", b"R2 29500 0 1,,1\n",
      b"R2 29500 1\n", b"R2 29500 0 1,1 7 8\n", b"R2 29500 -1 1\n", b"R2 29500 0 1,\xff\n", b"R2 29500 0 1,1e3\n"], []),
    # node 0 went: the master's new address last (a name, IPv4, IPv6 with a zone)
    ([b"R2 29500 0 1,1 10.0.0.3\n", b"R3 29501 1 1,1 fe80::1%eth0\n"],
     [("restart", 2, RestartWord(2, 29500, 0, (1, 1), "10.0.0.3")),
      ("restart", 3, RestartWord(3, 29501, 1, (1, 1), "fe80::1%eth0"))]),
    # ... but nothing a shell or a parser could take for more: each dropped
    ([b"R2 29500 0 1 a;b\n", b"R2 29500 0 1 $(x)\n", b"R2 29500 0 1 " + b"a" * 254 + b"\n",
      b"R2 29500 0 1 h\xc3\xa9\n", b"R2 29500 0 1 \n", b"R2 29500 0 1 a b\n", b"R2 29500 1.1.1.1\n"], []),
    # a word over MAX_WORD is dropped whole, and what follows its newline counts
    ([b"R2 29500 0 " + b"1," * (MAX_WORD // 2), b"1\nE7\n"], [("end", 7, None)]),
])
def test_stdin_words(chunks: list[bytes], said: list[tuple[str, int, RestartWord | None]]) -> None:
    """The head's bytes and words, as a launcher's stdin reader takes them from the stream."""
    words = StdinWords()
    assert [word for chunk in chunks for word in words.feed(chunk)] == said
    assert words.feed(restart_word(2, 29000) + end_attempt_word(1)) == [("restart", 2, RestartWord(2, 29000)),
                                                                        ("end", 1, None)]
    assert words.feed(restart_word(3, 29001, (1, [8] * 50_000))) == [
        ("restart", 3, RestartWord(3, 29001, 1, (8,) * 50_000))]  # 50,000 nodes in one word


def test_relaid_gives_the_node_its_new_place() -> None:
    """A node moved by a restart in place: its rank, the node count, the workers of every node
    (uneven or not), the attempt and port from the decision; its own workers stay."""
    node2 = Topology(env="ssh", nnodes=4, node_rank=2, nproc_per_node=1, master_addr="10.0.0.1", master_port=29500,
                     run_id="r", backend="gloo", host="h2", hosts=("h0", "h1", "h2", "h3"), node_workers=(2, 2, 1, 1),
                     restart_count=0)
    moved = relaid(node2, Restart(1, 29511, node_rank=1, node_workers=(2, 1, 1)))
    assert (moved.node_rank, moved.nnodes, moved.world_size, moved.master_port) == (1, 3, 4, 29511)
    assert [moved.global_rank(0)] == [2] and moved.restart_count == 1 and moved.hosts == ()
    assert moved.master_addr == "10.0.0.1"
    assert relaid(node2, Restart(1, 29511, 0, (1, 1), master_addr="10.0.0.2")).master_addr == "10.0.0.2"
    even = relaid(node2, Restart(1, 29511, node_rank=0, node_workers=(1, 1)))
    assert (even.node_workers, even.nproc_per_node, even.world_size, even.global_rank(0)) == ((), 1, 2, 0)
    with pytest.raises(ValueError, match="told to run 2 workers"):
        relaid(node2, Restart(1, 29511, node_rank=0, node_workers=(2, 1)))
    with pytest.raises(ValueError):
        relaid(node2, Restart(1, 29511, node_rank=2, node_workers=(1, 1)))


class _Launcher:
    """``clusterddp run JOB`` as the SSH head starts it on a host, its stdout read by a thread."""

    def __init__(self, job: Path, port: int, nnodes: int = 1, node_rank: int = 0) -> None:
        argv = [sys.executable, "-m", "clusterddp", "run", str(job), "--nnodes", str(nnodes), "--node-rank", str(node_rank),
                "--master-addr", "127.0.0.1", "--master-port", str(port), "--run-id", "aw", "--watch-stdin",
                "--keepalive-timeout", "60", "--emit-result", "--await-restart", "--restart-count", "0"]
        self.proc = subprocess.Popen(argv, env=cli_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.results: list[dict[str, object]] = []
        self.stderr = b""
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            if line.startswith(RESULT_MARKER):
                self.results.append(json.loads(line[len(RESULT_MARKER):]))

    def say(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def end(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=600)
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        return code


def test_a_restart_word_runs_the_next_attempt_on_the_same_launcher(job_dir: Path) -> None:
    """Attempt 0 fails (exit 3): the launcher reports it (result line marked waiting) and waits; the
    restart word runs attempt 1 in the same launcher (the same supervisor id) on the word's port,
    TORCHELASTIC_RESTART_COUNT=1; it succeeds, and the launcher ends with 0 and one run_start."""
    job = write_job(job_dir, script="record_attempts.py", args=[str(job_dir), "1"])
    launcher = _Launcher(job, 29731)
    assert wait_for(lambda: launcher.results, timeout=60), launcher.proc.poll()
    waiting = launcher.results[0]
    assert (waiting["exit_code"], waiting["attempt"], waiting["waiting"]) == (3, 0, True), waiting
    time.sleep(0.3)
    assert launcher.proc.poll() is None  # it waits
    launcher.say(restart_word(1, 29733))
    assert wait_for(lambda: len(launcher.results) == 2, timeout=60)
    assert launcher.results[1]["exit_code"] == 0 and "waiting" not in launcher.results[1]
    assert launcher.end() == 0, launcher.stderr
    records = {(r, a): json.loads((job_dir / f"rank{r}.attempt{a}.json").read_text()) for r in (0, 1) for a in (0, 1)}
    for rank in (0, 1):
        before, after = records[rank, 0], records[rank, 1]
        assert after["CLUSTERDDP_SUPERVISOR_ID"] == before["CLUSTERDDP_SUPERVISOR_ID"]
        assert (before["TORCHELASTIC_RESTART_COUNT"], after["TORCHELASTIC_RESTART_COUNT"]) == ("0", "1")
        assert (before["MASTER_PORT"], after["MASTER_PORT"]) == ("29731", "29733")
        assert "--- clusterddp: restart 1 " in (job_dir / "logs" / "aw" / f"rank{rank}.log").read_text()
    events = [json.loads(line) for line in (job_dir / "logs" / "aw" / "events.node0.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds.count("run_start") == 1 and kinds.count("attempt_start") == 2, kinds
    assert [e for e in events if e["kind"] == "restart"][0]["in_place"] is True
    assert b"2 attempts:" not in launcher.stderr  # the head lists the attempts of a job it restarts


def test_a_restart_word_with_a_new_place_moves_the_launcher(job_dir: Path) -> None:
    """Two launchers (nodes 0 and 1, a worker each) fail attempt 0 and wait. Node 0 is released
    (its host lost, as the head sees it) and node 1 is told to run attempt 1 as node 0 of one:
    its worker is rank 0 of world size 1 (the env of a node 0), forked by the same launcher,
    writing rank 0's log, whose lock it takes over once node 0's launcher let go of it."""
    job = write_job(job_dir, script="record_attempts.py", args=[str(job_dir), "1"], nproc_per_node=1)
    node0, node1 = _Launcher(job, 29751, nnodes=2, node_rank=0), _Launcher(job, 29751, nnodes=2, node_rank=1)
    assert wait_for(lambda: node0.results and node1.results, timeout=60), (node0.proc.poll(), node1.proc.poll())
    assert node1.results[0]["waiting"] is True
    assert node0.end() == 3, node0.stderr
    node1.say(restart_word(1, 29753, (0, [1])))
    assert wait_for(lambda: len(node1.results) == 2, timeout=60), node1.proc.poll()
    assert node1.results[1]["exit_code"] == 0, node1.results
    assert node1.end() == 0, node1.stderr
    before = json.loads((job_dir / "rank1.attempt0.json").read_text())
    after = json.loads((job_dir / "rank0.attempt1.json").read_text())
    assert after["CLUSTERDDP_SUPERVISOR_ID"] == before["CLUSTERDDP_SUPERVISOR_ID"]  # the same launcher
    assert {k: after[k] for k in ("RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                                  "LOCAL_RANK", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")} == {
        "RANK": "0", "WORLD_SIZE": "1", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "1",
        "LOCAL_RANK": "0", "MASTER_PORT": "29753", "TORCHELASTIC_RESTART_COUNT": "1"}
    assert (before["RANK"], before["WORLD_SIZE"], before["GROUP_RANK"]) == ("1", "2", "1")
    assert "--- clusterddp: restart 1 " in (job_dir / "logs" / "aw" / "rank0.log").read_text()
    events = [json.loads(line) for line in (job_dir / "logs" / "aw" / "events.node1.jsonl").read_text().splitlines()]
    moved = [e for e in events if e["kind"] == "restart"]
    assert len(moved) == 1 and moved[0]["in_place"] is True, events
    assert (moved[0]["node_rank"], moved[0]["ranks"], moved[0]["world_size"]) == (0, [0], 1), moved


def test_a_place_that_does_not_fit_ends_the_launcher_with_one_line(job_dir: Path) -> None:
    """A restart word that gives this node more workers than it runs (a head of another mind): the
    launcher does not guess; one line, no traceback, it ends with the failed attempt's exit."""
    job = write_job(job_dir, script="record_attempts.py", args=[str(job_dir), "1"], nproc_per_node=1)
    launcher = _Launcher(job, 29761)
    assert wait_for(lambda: launcher.results, timeout=60), launcher.proc.poll()
    launcher.say(restart_word(1, 29763, (0, [2, 1])))
    assert launcher.proc.wait(timeout=600) == 3
    assert launcher.end() == 3
    assert b"not running attempt 1 as node 0: node 0 is told to run 2 workers; it runs 1" in launcher.stderr
    assert b"Traceback" not in launcher.stderr, launcher.stderr
    assert not (job_dir / "rank0.attempt1.json").exists()


def test_the_end_word_ends_the_attempt_not_the_launcher(job_dir: Path) -> None:
    """The end word for the running attempt: its workers are stopped, it is reported as ended by the
    head (no failure of its own) and the launcher waits; a word for another attempt is ignored;
    EOF then ends the launcher with the attempt's exit."""
    job = write_job(job_dir, script="wait_signal.py", args=[str(job_dir)])
    launcher = _Launcher(job, 29741)
    assert wait_for(lambda: len(list(job_dir.glob("rank*.ready"))) == 2)
    launcher.say(end_attempt_word(5))  # not this attempt's
    time.sleep(0.5)
    assert not launcher.results
    launcher.say(end_attempt_word(0))
    assert wait_for(lambda: launcher.results, timeout=300)
    ended = launcher.results[0]
    assert ended["waiting"] is True and ended["root_cause"] is None, ended
    assert "the head ended the attempt" in str(ended["reason"]), ended
    assert launcher.proc.poll() is None
    assert launcher.end() == 1, launcher.stderr
    assert b"the head ended the attempt" in launcher.stderr


def test_await_restart_needs_watch_stdin(job_dir: Path) -> None:
    """Without --watch-stdin no word can come: one line, exit 2, no traceback."""
    job = write_job(job_dir, script="exit_with.py", args=["0"])
    done = cli("run", str(job), "--await-restart")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr, done.stderr
    assert "--await-restart needs --watch-stdin" in done.stderr
