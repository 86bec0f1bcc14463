"""Local supervision with real worker processes (tests/bin), never mocks of subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from clusterddp.protocol import stop_request_byte, stop_requested, worker_stop_signal
from tests.conftest import cli, cli_env, start_cli, wait_for, write_job


def _alive(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids(directory: Path, pattern: str) -> list[int]:
    pids: list[int] = []
    for path in directory.glob(pattern):
        pids.extend(int(p) for p in path.read_text().split())
    return pids


def test_worker_exit_code_is_the_launchers_and_names_root_cause(job_dir: Path) -> None:
    """A worker exiting 3 makes the launcher exit 3 and name that rank, host and log."""
    job = write_job(job_dir, script="exit_with.py", args=["3", "1"])
    result = cli("run", str(job))
    assert result.returncode == 3, result.stderr
    assert "rank 1 on" in result.stderr and "exit code 3" in result.stderr
    assert "root cause" in result.stderr and "rank1.log" in result.stderr
    assert "rank 1 exiting with 3" in result.stderr  # last lines of stderr
    assert "rank 0 on" in result.stderr and "stopped by clusterddp" in result.stderr
    assert "Traceback" not in result.stderr.split("root cause")[0]


def test_sigsegv_is_reported_by_name(job_dir: Path) -> None:
    """A worker killed by SIGSEGV is reported with the signal's name and exit 128+11."""
    job = write_job(job_dir, script="segfault.py")
    result = cli("run", str(job))
    assert result.returncode == 128 + signal.SIGSEGV
    assert "rank 1" in result.stderr and "killed by SIGSEGV" in result.stderr


def test_sigterm_to_launcher_stops_hanging_workers(job_dir: Path) -> None:
    """SIGTERM to the launcher stops workers that ignore SIGTERM (SIGKILL after grace)."""
    job = write_job(job_dir, script="hang.py", args=[str(job_dir), "stubborn"], grace_period=1)
    proc = start_cli("run", str(job))
    assert wait_for(lambda: len(list(job_dir.glob("rank*.pid"))) == 2)
    pids = _pids(job_dir, "rank*.pid")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "received SIGTERM" in err
    assert not any(_alive(p) for p in pids)


def test_kill_9_of_launcher_leaves_no_worker(job_dir: Path) -> None:
    """SIGKILL of the launcher: PDEATHSIG and the reaper leave no worker and no child behind."""
    job = write_job(job_dir, script="with_children.py", args=[str(job_dir)], nproc_per_node=2)
    proc = start_cli("run", str(job))
    assert wait_for(lambda: len(list(job_dir.glob("rank*.pids"))) == 2)
    pids = _pids(job_dir, "rank*.pids")
    proc.kill()
    proc.communicate(timeout=600)
    assert wait_for(lambda: not any(_alive(p) for p in pids), timeout=5), \
        [p for p in pids if _alive(p)]


def test_dataloader_style_children_are_reaped(job_dir: Path) -> None:
    """A failing rank's and a stopped rank's children (also one in its own session) are reaped."""
    job = write_job(job_dir, script="with_children.py", args=[str(job_dir)])
    result = cli("run", str(job))
    assert result.returncode == 4
    pids = _pids(job_dir, "rank*.pids")
    assert len(pids) == 6
    assert wait_for(lambda: not any(_alive(p) for p in pids), timeout=5), \
        [p for p in pids if _alive(p)]


def test_restarts_recover_from_one_failure(job_dir: Path) -> None:
    """restarts: 2 with a worker failing once succeeds on restart 1 with the count in the env."""
    job = write_job(job_dir, script="fail_once.py", restarts=2)
    result = cli("run", str(job))
    assert result.returncode == 0, result.stderr
    assert "restarting the local group" in result.stderr
    assert "rank 1 attempt 1" in result.stdout and "rank 0 attempt 1" in result.stdout


def test_restarts_exhausted_returns_failure(job_dir: Path) -> None:
    """A worker that always fails exhausts restarts and its code is returned."""
    job = write_job(job_dir, script="exit_with.py", args=["5", "0"], restarts=1)
    result = cli("run", str(job))
    assert result.returncode == 5
    assert result.stderr.count("restarting the local group") == 1


def test_sigusr1_is_forwarded_to_workers(job_dir: Path) -> None:
    """SIGUSR1 sent to the launcher reaches every worker, which then exit cleanly."""
    job = write_job(job_dir, script="wait_signal.py", args=[str(job_dir)])
    proc = start_cli("run", str(job))
    assert wait_for(lambda: len(list(job_dir.glob("rank*.ready"))) == 2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert out.count("got SIGUSR1") == 2


def test_fast_printer_loses_and_splits_no_line(job_dir: Path) -> None:
    """20k lines per rank, long and short, stdout and stderr: all in the log file, whole, in order."""
    n = 20000
    job = write_job(job_dir, script="print_fast.py", args=[str(n)], nproc_per_node=2)
    result = cli("run", str(job), "--run-id", "fast")
    assert result.returncode == 0, result.stderr[-2000:]
    for rank in (0, 1):
        lines = (job_dir / "logs" / "fast" / f"rank{rank}.log").read_text().splitlines()
        assert len(lines) == n
        numbers = [int(line.split()[2]) for line in lines]
        out_numbers = [i for i in numbers if i % 10]
        err_numbers = [i for i in numbers if i % 10 == 0]
        assert out_numbers == sorted(out_numbers) and err_numbers == sorted(err_numbers)
        assert set(numbers) == set(range(n))
    console = result.stdout.splitlines() + result.stderr.splitlines()
    prefixed = [line for line in console if line.startswith("[")]
    assert len(prefixed) == 2 * n
    assert all(line.split("] ", 1)[1].startswith(("r0 line", "r1 line")) for line in prefixed)


def test_console_rank_filter_and_no_prefix(job_dir: Path) -> None:
    """logs.ranks limits the console to rank 0; --no-prefix drops the prefix; files keep all."""
    job = write_job(job_dir, script="print_fast.py", args=["5"], logs={"dir": str(job_dir / "logs"), "ranks": [0]})
    result = cli("run", str(job), "--no-prefix", "--run-id", "filt")
    assert result.returncode == 0
    assert "r1 line" not in result.stdout + result.stderr
    assert "r0 line 1" in result.stdout and not result.stdout.startswith("[")
    assert (job_dir / "logs" / "filt" / "rank1.log").read_text().count("r1 line") == 5


@pytest.mark.slow
def test_record_traceback_reaches_the_report(job_dir: Path) -> None:
    """A torchrun-style script with @record: its traceback from the error file is in the report."""
    job = write_job(job_dir, script="record_fail.py")
    result = cli("run", str(job))
    assert result.returncode == 1, result.stderr
    report = result.stderr.split("root cause", 1)[1]
    assert "ValueError: bad batch shape in rank one" in report
    assert "rank:       1" in report


def test_env_contract_per_worker(job_dir: Path) -> None:
    """Each worker gets torchrun's names with the right ranks; the launcher's own env passes through."""
    job = write_job(job_dir, script="dump_env.py", args=[str(job_dir)], nproc_per_node=3,
                    env={"MY_SETTING": "42"})
    result = cli("run", str(job), "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                 "--master-port", "29555", "--run-id", "contract")
    assert result.returncode == 0, result.stderr
    for local in range(3):
        env = json.loads((job_dir / f"rank{3 + local}.json").read_text())["env"]
        assert env["RANK"] == str(3 + local) and env["LOCAL_RANK"] == str(local)
        assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == "3"
        assert env["GROUP_RANK"] == env["NODE_RANK"] == "1" and env["GROUP_WORLD_SIZE"] == "2"
        assert env["ROLE_RANK"] == env["RANK"] and env["ROLE_WORLD_SIZE"] == "6" and env["ROLE_NAME"] == "default"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29555"
        assert env["TORCHELASTIC_RUN_ID"] == "contract" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"rank{3 + local}.error.json")
        assert env["MY_SETTING"] == "42" and env["OMP_NUM_THREADS"] == "1"
        assert env["PATH"] == os.environ["PATH"]


def test_port_in_use_is_one_clear_line(job_dir: Path) -> None:
    """A master port already bound on the master node: one line, exit 2, nothing started."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        job = write_job(job_dir, script="dump_env.py", args=[str(job_dir)], master={"port": port})
        result = cli("run", str(job))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and f"master port {port}" in result.stderr
    assert not list(job_dir.glob("rank*.json"))


def test_preempted_workers_exit_75_and_peers_finish_on_their_own(job_dir: Path) -> None:
    """Exit 75 (checkpoint saved) is reported as a preemption; peers get to exit 75 themselves."""
    job = write_job(job_dir, script="preempt_exit.py", args=["0.2", str(job_dir)], grace_period=3)
    result = cli("run", str(job))
    assert result.returncode == 75, result.stderr
    assert "preempted: rank 0" in result.stderr and "requeue" in result.stderr
    assert "stopped by clusterddp" not in result.stderr


def test_sigterm_while_workers_save_checkpoints_exits_75(job_dir: Path) -> None:
    """A scheduler's SIGTERM to the launcher, workers answering with exit 75: the launcher exits 75."""
    job = write_job(job_dir, script="preempt_exit.py", args=["600", str(job_dir)])
    proc = start_cli("run", str(job))
    assert wait_for(lambda: len(list(job_dir.glob("rank*.ready"))) == 2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=600)
    assert proc.returncode == 75


def test_nonfinite_loss_exit_is_not_restarted(job_dir: Path) -> None:
    """Exit 65 (NaN loss agreed by all ranks) is final: restarts are not spent on it."""
    job = write_job(job_dir, script="exit_with.py", args=["65", "0"], restarts=2)
    result = cli("run", str(job))
    assert result.returncode == 65
    assert "restarting" not in result.stderr


def test_crash_stays_the_root_cause_when_peers_checkpoint_on_sigterm(job_dir: Path) -> None:
    """Rank 1 crashes (exit 3); rank 0 answers the teardown's SIGTERM with exit 75: exit 3, not 75."""
    job = write_job(job_dir, script="crash_or_checkpoint.py")
    result = cli("run", str(job))
    assert result.returncode == 3, result.stderr
    assert "failed: rank 1" in result.stderr


def test_console_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    """The [host rank R] prefix is coloured on a TTY; NO_COLOR and pipes turn colour off."""
    import io

    from clusterddp.launch.observe.logs import ConsoleSink, use_colour

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_colour(Tty()) and not use_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(Tty())
    sink = ConsoleSink(colour_out=True, colour_err=False)
    assert sink.label("h", 3, stderr=False).startswith(b"\033[") and b"[h rank 3] " in sink.label("h", 3, False)
    assert sink.label("h", 3, stderr=True) == b"[h rank 3] "
    assert ConsoleSink(prefix=False).label("h", 3, False) == b""


@pytest.mark.parametrize("signum, handled", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated"),
                                             (signal.SIGHUP, "terminated"), (signal.SIGQUIT, "terminated")])
def test_a_stop_signal_reaches_the_workers_as_the_launcher_got_it(job_dir: Path, signum: int, handled: str) -> None:
    """Ctrl-C reaches every worker as SIGINT (its except KeyboardInterrupt runs), the others as SIGTERM; exit 128+N."""
    job = write_job(job_dir, script="keyboard_interrupt.py", args=[str(job_dir)], grace_period=5)
    proc = start_cli("run", str(job))
    assert wait_for(lambda: len(list(job_dir.glob("rank*.ready"))) == 2)
    pids = _pids(job_dir, "rank*.ready")
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signum, err
    assert sorted(p.name for p in job_dir.glob(f"rank*.{handled}")) == [f"rank0.{handled}", f"rank1.{handled}"], err
    assert not list(job_dir.glob("rank*.terminated" if handled == "interrupted" else "rank*.interrupted"))
    assert not any(_alive(p) for p in pids)


@pytest.mark.parametrize("received, sent", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM),
                                            (signal.SIGHUP, signal.SIGTERM), (signal.SIGQUIT, signal.SIGTERM),
                                            (None, signal.SIGTERM)])
def test_the_workers_stop_signal_and_the_heads_stop_byte(received: int | None, sent: int) -> None:
    """SIGINT stays SIGINT, the rest (and a failure) SIGTERM; the head's stop byte names what it got."""
    assert worker_stop_signal(received) == sent
    if received is not None:
        assert stop_requested(b"\n\n" + stop_request_byte(received)) == received
    assert stop_requested(b"\n\nS\n") is None


def test_the_heads_stop_byte_reaches_the_workers_as_its_signal(job_dir: Path) -> None:
    """A launcher under the SSH head (--watch-stdin) reading the SIGINT byte, then EOF: workers get SIGINT, exit 130."""
    job = write_job(job_dir, script="keyboard_interrupt.py", args=[str(job_dir)], grace_period=5)
    with open(job_dir / "launcher.err", "w+") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "clusterddp", "run", str(job), "--watch-stdin"],
                                env=cli_env(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr)
        assert proc.stdin is not None
        assert wait_for(lambda: len(list(job_dir.glob("rank*.ready"))) == 2)
        proc.stdin.write(b"\n" + stop_request_byte(signal.SIGINT))
        proc.stdin.close()
        proc.wait(timeout=600)
        err = (job_dir / "launcher.err").read_text()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert len(list(job_dir.glob("rank*.interrupted"))) == 2, err
    assert "the head received SIGINT" in err
