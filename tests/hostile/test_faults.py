"""Faults the launcher must survive with its promises intact: a full log disk, a huge line,
hostile terminal output, a daemon that escapes its job, a silent hang, stubborn workers, a
closed console. Real processes throughout (tests/bin), no mocks."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Iterator

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp.launch.teardown import cgroup
from clusterddp.launch.observe.logs import LINE_LIMIT, ConsoleSink, WorkerOutput, visible
from tests.conftest import BIN, REPO, cli, cli_env, start_cli, wait_for, write_job

CONTROL_BYTES = (b"\x1b", b"\x07", b"\x08", b"\r", b"\x00", b"\x7f", b"\xc2\x9b")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _read_pid(path: Path) -> int:
    assert wait_for(path.exists, timeout=120), f"{path} never written"
    return int(path.read_text())


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs, unmounted afterwards whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MB tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# -- logs never harm the job -------------------------------------------------------------------

def test_full_log_disk_does_not_kill_a_healthy_job(tmp_path: Path, tiny_disk: Path) -> None:
    """Two ranks print 2 MB each into a 1 MB log disk: exit 0, one warning per rank, all on the console."""
    job = write_job(tmp_path, script="flood.py", args=["2"], logs={"dir": str(tiny_disk)}, grace_period=1)
    result = cli("run", str(job), timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines() if "cannot write its log" in line]
    assert len(warnings) == 2 and all(os.strerror(errno.ENOSPC) in w for w in warnings), warnings
    assert "Traceback" not in result.stderr
    for rank in (0, 1):
        assert result.stdout.count(f"rank {rank}] r{rank} x") == 2048


def test_full_log_disk_keeps_the_root_cause_in_the_report(tmp_path: Path, tiny_disk: Path) -> None:
    """On a full log disk a failing rank's exit code and stderr line still reach the report."""
    job = write_job(tmp_path, script="flood.py", args=["2", "1"], logs={"dir": str(tiny_disk)}, grace_period=1)
    result = cli("run", str(job), timeout=600)
    assert result.returncode == 3, result.stderr[-2000:]
    report = result.stderr.split("root cause", 1)[1]
    assert "rank 1 failed: the disk was not the cause" in report.split("last lines:", 1)[1]
    assert f"(incomplete: {os.strerror(errno.ENOSPC)})" in report


def test_failing_log_writes_switch_to_console_and_keep_draining(tmp_path: Path) -> None:
    """A log on /dev/full (ENOSPC) and one that cannot be opened: one warning each, pipes drained, tail kept."""
    said: list[str] = []

    class Recording(ConsoleSink):
        def say(self, text: str, stderr: bool = True) -> None:
            said.append(text)

        def write(self, label: bytes, line: bytes, stderr: bool) -> None:
            shown_lines.append(line)

    shown_lines: list[bytes] = []
    script = "import sys\nfor i in range(20000): print('line', i)\nprint('the cause', file=sys.stderr)"
    for log in ("/dev/full", str(tmp_path / "missing" / "rank0.log")):
        said.clear()
        shown_lines.clear()
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        output = WorkerOutput(0, "h", log, Recording(prefix=False, ranks=frozenset()))
        output.pump(proc.stdout, proc.stderr)
        assert proc.wait(timeout=600) == 0  # never blocked on a pipe nobody drains
        output.close(time.monotonic() + 10)
        assert len(said) == 1 and "console only" in said[0], said
        assert output.log_error and list(output.stderr_tail) == ["the cause"]
        assert b"".join(shown_lines).count(b"\n") == 20001  # shown although logs.ranks hid rank 0


def test_a_400mb_style_line_costs_bounded_memory(tmp_path: Path) -> None:
    """One 64 MiB line: launcher peak RSS < 100 MB, the file has every byte, the console a cut line."""
    job = write_job(tmp_path, script="huge_line.py", args=["64"], nproc_per_node=1)
    proc = start_cli("run", str(job), "--run-id", "huge")
    peak = 0
    captured: dict[str, str] = {}
    reader = threading.Thread(target=lambda: captured.update(zip(("out", "err"), proc.communicate(timeout=600))))
    reader.start()
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                peak = max([peak] + [int(line.split()[1]) for line in f if line.startswith("VmHWM")])
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    reader.join(600)
    assert proc.returncode == 0, captured.get("err", "")[-2000:]
    assert 0 < peak < 100 * 1024, f"launcher peak RSS {peak} KiB"
    log = tmp_path / "logs" / "huge" / "rank0.log"
    assert log.stat().st_size == (64 << 20) + len(b"END\nafter the long line\n")
    with open(log, "rb") as f:
        f.seek(64 << 20)
        assert f.read() == b"END\nafter the long line\n"
    lines = captured["out"].splitlines()
    assert len(lines) == 2 and "line cut at 64 KiB" in lines[0] and len(lines[0]) < LINE_LIMIT + 200
    assert lines[1].endswith("] after the long line")


def test_control_sequences_are_shown_not_obeyed(tmp_path: Path) -> None:
    """ESC/CSI/OSC/BEL/CR/BS/DEL/NUL/C1 from a worker: escaped on the console and in the report, raw in the file."""
    job = write_job(tmp_path, script="escapes.py", args=["3"], nproc_per_node=1)
    result = subprocess.run([sys.executable, "-m", "clusterddp", "run", str(job), "--run-id", "esc"],
                            cwd=REPO, env=cli_env(), capture_output=True, timeout=600)
    assert result.returncode == 3
    console = result.stdout + result.stderr
    for byte in CONTROL_BYTES:
        assert byte not in console, byte
    assert b"A\\x1b[2J\\x1b]0;pwned\\x07B\\rC\\x08D\tE\\x9b31mF\\x7fG\\x00H" in result.stdout
    assert b"      err A\\x1b[2J" in result.stderr.split(b"last lines:")[1]  # the report's tail too
    raw = (tmp_path / "logs" / "esc" / "rank0.log").read_bytes()
    assert b"A\x1b[2J\x1b]0;pwned\x07B\rC\bD\tE\xc2\x9b31mF\x7fG\x00H\n" in raw


def test_visible_keeps_text_tabs_and_utf8() -> None:
    """Only control characters are escaped: text, tabs, newlines and non-ASCII letters pass unchanged."""
    assert visible("naïve\t日本 ok\n".encode()) == "naïve\t日本 ok\n".encode()
    assert visible(b"\x1b[31mred\x1b[0m\r\n") == b"\\x1b[31mred\\x1b[0m\\r\n"


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.one_of(st.binary(max_size=300), st.sampled_from([b"\n", b"\x1b[2J", b"\r\n"]),
                                 st.integers(LINE_LIMIT - 2, LINE_LIMIT + 70000).map(lambda n: b"z" * n)),
                       max_size=12))
def test_any_chunking_keeps_the_file_raw_and_the_console_whole(tmp_path_factory: pytest.TempPathFactory,
                                                               pieces: list[bytes]) -> None:
    """Whatever the bytes and however the pipe splits them: the file gets them unchanged, the console whole, visible lines."""
    data = b"".join(pieces)
    shown_lines: list[bytes] = []

    class Recording(ConsoleSink):
        def write(self, label: bytes, line: bytes, stderr: bool) -> None:
            shown_lines.append(line)

    directory = tmp_path_factory.mktemp("chunks")
    log = directory / "rank0.log"
    (directory / "pieces").write_text("\n".join(p.hex() for p in pieces if p))
    read_end, write_end = os.pipe()
    writer = "import os, sys\nfor p in open(sys.argv[1]).read().split(): os.write(1, bytes.fromhex(p))"
    proc = subprocess.Popen([sys.executable, "-c", writer, str(directory / "pieces")], stdout=write_end)
    os.close(write_end)
    output = WorkerOutput(0, "h", str(log), Recording(prefix=False))
    output.pump(os.fdopen(read_end, "rb"), None)
    proc.wait(timeout=600)
    output.close(time.monotonic() + 10)
    assert log.read_bytes() == (data if not data or data.endswith(b"\n") else data + b"\n")
    console = b"".join(shown_lines)
    assert not any(byte in console for byte in CONTROL_BYTES)
    assert console.count(b"\n") == (data if data.endswith(b"\n") or not data else data + b"\n").count(b"\n")
    assert all(len(line) <= LINE_LIMIT + 100 for line in console.split(b"\n"))


# -- nothing outlives the job ------------------------------------------------------------------

def _cgroup_works() -> bool:
    """Whether a job cgroup can be created here (cgroup2 writable, cgroup.kill present)."""
    probe = cgroup.JobCgroup.create(f"{os.getpid()}-probe{os.urandom(3).hex()}")
    if probe is None:
        return False
    probe.remove(time.monotonic() + 1)
    return True


def _env_for(use_cgroup: bool) -> dict[str, str]:
    if use_cgroup and not _cgroup_works():
        pytest.skip("no writable cgroup v2 with cgroup.kill here (the other mechanisms are tested)")
    return cli_env() if use_cgroup else cli_env(CLUSTERDDP_NO_CGROUP="1")


def _cgroups_of(launcher_pid: int) -> list[str]:
    """Job cgroups left by the launcher with this pid."""
    parent = cgroup._parent_dir()
    if parent is None:
        return []
    return [n for n in os.listdir(parent) if n.startswith(f"{cgroup.PREFIX}{launcher_pid}-")]


@pytest.mark.parametrize("use_cgroup", [True, False], ids=["cgroup", "subreaper"])
def test_double_fork_empty_env_daemon_is_gone_after_the_job(tmp_path: Path, use_cgroup: bool) -> None:
    """A setsid + double fork + empty-env daemon holding the worker's pipes dies with the job."""
    job = write_job(tmp_path, script="daemonize.py", args=[str(tmp_path)], grace_period=1)
    proc = start_cli("run", str(job), env=_env_for(use_cgroup))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    daemons = [_read_pid(tmp_path / f"daemon{r}.pid") for r in (0, 1)]
    assert not any(_alive(p) for p in daemons), [p for p in daemons if _alive(p)]
    assert not _cgroups_of(proc.pid)


@pytest.mark.parametrize("use_cgroup", [True, False], ids=["cgroup", "subreaper"])
def test_kill_9_of_the_launcher_takes_the_daemon_along(tmp_path: Path, use_cgroup: bool) -> None:
    """kill -9 of the launcher: the reaper kills the empty-env daemon (via the cgroup, or as an adopted orphan)."""
    job = write_job(tmp_path, script="daemonize.py", args=[str(tmp_path), "stay"])
    proc = start_cli("run", str(job), env=_env_for(use_cgroup))
    daemons: list[int] = []
    try:
        daemons = [_read_pid(tmp_path / f"daemon{r}.pid") for r in (0, 1)]
        # Reparented to the launcher (its subreaper), which then tells the reaper their pids.
        assert wait_for(lambda: all(psutil.Process(p).ppid() == proc.pid for p in daemons), timeout=120)
        assert wait_for(lambda: _reaper_read_orphans(proc.pid, daemons), timeout=120)
        assert bool(_cgroups_of(proc.pid)) == use_cgroup
        proc.kill()
        proc.communicate(timeout=120)
        assert wait_for(lambda: not any(_alive(p) for p in daemons), timeout=120), \
            [p for p in daemons if _alive(p)]
        assert wait_for(lambda: not _cgroups_of(proc.pid), timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        _end_leftovers(daemons)


def _reaper_read_orphans(launcher: int, orphans: list[int]) -> bool:
    """The launcher's reaper has read the line of every orphan (``p<pid>``, reaper.py) and of
    every worker's group: what it read (``rchar``: its pipe from the launcher is all it reads)
    is at least their bytes. Exact where a sleep would only guess how loaded the machine is."""
    reapers = _reapers_of(launcher)
    if len(reapers) != 1:
        return False
    reaper = reapers.pop()
    try:
        groups = [c.pid for c in psutil.Process(launcher).children() if c.pid != reaper and c.pid not in orphans]
        read = psutil.Process(reaper).io_counters().read_chars
    except psutil.Error:
        return False
    return read >= sum(len(f"{g}\n") for g in groups) + sum(len(f"p{p}\n") for p in orphans)


def _preload_daemon_job(tmp_path: Path, mode: str, *args: str) -> Path:
    """A warm job whose preload (tests/bin/preload_daemon.py) starts a process in a new
    session in the zygote: its child (``setsid``) or a daemon (``double-fork``)."""
    return write_job(tmp_path, script="exit_with.py", args=list(args), warm_start=True, preload=["preload_daemon"],
                     env={"PYTHONPATH": str(BIN), "PRELOAD_DAEMON_DIR": str(tmp_path), "PRELOAD_DAEMON_MODE": mode})


def _end_daemon(pid: int) -> list[int]:
    """[pid] if the daemon still ran (then it is ended here, by its pid), else []."""
    if not _alive(pid):
        return []
    os.kill(pid, signal.SIGKILL)
    return [pid]


@pytest.mark.parametrize("mode", ["setsid", "double-fork"])
@pytest.mark.parametrize("use_cgroup", [True, False], ids=["cgroup", "subreaper"])
def test_a_daemon_a_preload_starts_is_gone_after_the_job(tmp_path: Path, use_cgroup: bool, mode: str) -> None:
    """A process in a new session (its child, or a double-forked daemon), empty environment,
    started by a preload in the warm interpreter: gone after the job."""
    proc = start_cli("run", str(_preload_daemon_job(tmp_path, mode, "0")), env=_env_for(use_cgroup))
    out, err = proc.communicate(timeout=300)
    daemon = _read_pid(tmp_path / "preload_daemon.pid")
    # SIGKILLed before the launcher exited; the kernel may still be ending it: no timing claim.
    wait_for(lambda: not _alive(daemon), timeout=60)
    left = _end_daemon(daemon)
    assert proc.returncode == 0, err
    assert "warm start off" not in err
    assert not left, f"the preload's daemon (pid {left}) outlived the job"
    assert not _cgroups_of(proc.pid)


@pytest.mark.parametrize("mode", ["setsid", "double-fork"])
def test_kill_9_of_the_launcher_takes_a_preload_daemon_along(tmp_path: Path, mode: str) -> None:
    """kill -9 of the launcher: the reaper kills the preload's daemon through the warm interpreter's cgroup."""
    proc = start_cli("run", str(_preload_daemon_job(tmp_path, mode, "1", "5")), env=_env_for(True))  # no rank 5: all wait
    daemon = 0
    try:
        daemon = _read_pid(tmp_path / "preload_daemon.pid")
        # the workers run (forked by the zygote: its cmdline), so the reaper knows everything
        assert wait_for(lambda: sum("zygote.py" in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children())
                        >= 3, timeout=300)
        proc.kill()
        proc.communicate(timeout=600)
        wait_for(lambda: not _alive(daemon), timeout=60)
        assert not _end_daemon(daemon), f"the preload's daemon (pid {daemon}) outlived a kill -9 of the launcher"
        assert wait_for(lambda: not _cgroups_of(proc.pid), timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if daemon:
            _end_daemon(daemon)


def _reapers_of(launcher: int) -> set[int]:
    """The launcher's live forked reapers: its children that still have its command line
    (workers exec'd their own)."""
    try:
        parent = psutil.Process(launcher)
        cmdline = parent.cmdline()
        children = parent.children()
    except psutil.Error:
        return set()
    found = set()
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE and child.cmdline() == cmdline:
                found.add(child.pid)
        except psutil.Error:
            continue
    return found


def _job_pids(directory: Path, ranks: int = 2) -> list[int]:
    """Every rank's pid and its two children's (plain, setsid) from with_children.py's files."""
    assert wait_for(lambda: [len(f.read_text().split()) for f in directory.glob("rank*.pids")] == [3] * ranks,
                    timeout=120), list(directory.iterdir())
    return [int(pid) for f in directory.glob("rank*.pids") for pid in f.read_text().split()]


class _Output:
    """A running launcher's stdout and stderr, read as they come (a line may be what a test
    waits for, however long a loaded machine takes to print it)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._err: list[str] = []
        self._threads = [threading.Thread(target=self._drain, args=(stream, sink), daemon=True)
                         for stream, sink in ((proc.stdout, []), (proc.stderr, self._err))]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _drain(stream: IO[str] | None, sink: list[str]) -> None:
        for line in stream or ():
            sink.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self._err))

    def err(self) -> str:
        """All of stderr once the launcher closed it (else what came so far, after 120 s)."""
        for thread in self._threads:
            thread.join(120)
        return "".join(self._err)


def _end_leftovers(pids: list[int]) -> None:
    """SIGKILL what this test started and the launcher failed to end (so a failure leaks nothing)."""
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("how", "use_cgroup"),
                         [(signal.SIGKILL, True), (signal.SIGKILL, False), (signal.SIGSTOP, False)],
                         ids=["killed-cgroup", "killed-subreaper", "stopped-subreaper"])
def test_a_lost_reaper_is_replaced_before_kill_9_of_the_launcher(tmp_path: Path, how: int, use_cgroup: bool) -> None:
    """Reaper killed (or stopped), then kill -9 of the launcher: a plain child and a setsid one die, the cgroup goes."""
    job = write_job(tmp_path, script="with_children.py", args=[str(tmp_path), "stay"])
    proc = start_cli("run", str(job), env=_env_for(use_cgroup))
    pids: list[int] = []
    lost: set[int] = set()
    try:
        pids = _job_pids(tmp_path)
        lost = _reapers_of(proc.pid)
        assert len(lost) == 1, lost
        output = _Output(proc)
        os.kill(lost.copy().pop(), how)
        # said once the new reaper was told everything the lost one knew (Reaper.check)
        assert wait_for(lambda: output.has("started a new one"), timeout=120), output.err()
        assert bool(_cgroups_of(proc.pid)) == use_cgroup
        proc.kill()
        proc.wait(timeout=120)
        err = output.err()
        assert wait_for(lambda: not any(_alive(p) for p in pids), timeout=120), \
            f"alive after kill -9: {[p for p in pids if _alive(p)]} of {pids}"
        assert wait_for(lambda: not _cgroups_of(proc.pid), timeout=120), _cgroups_of(proc.pid)
        assert f"the reaper (pid {lost.pop()})" in err and "started a new one" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
        _end_leftovers(pids + list(lost))


def test_a_reaper_lost_during_teardown_is_replaced_too(tmp_path: Path) -> None:
    """Reaper killed in a teardown's grace period, then kill -9 of the launcher: the setsid child still dies."""
    job = write_job(tmp_path, script="with_children.py", args=[str(tmp_path), "stubborn"], grace_period=60,
                    nproc_per_node=1)
    proc = start_cli("run", str(job))
    pids: list[int] = []
    lost: set[int] = set()
    try:
        pids = _job_pids(tmp_path, ranks=1)
        lost = _reapers_of(proc.pid)
        output = _Output(proc)
        proc.send_signal(signal.SIGTERM)  # the rank ignores it: the launcher waits out the grace period
        assert wait_for(lambda: not _alive(pids[1]), timeout=120)  # the plain child took the SIGTERM
        os.kill(lost.copy().pop(), signal.SIGKILL)
        assert wait_for(lambda: output.has("started a new one"), timeout=55), output.err()  # within the grace period
        proc.kill()
        proc.wait(timeout=120)
        err = output.err()
        assert wait_for(lambda: not any(_alive(p) for p in pids), timeout=120), \
            f"alive after kill -9: {[p for p in pids if _alive(p)]} of {pids}"
        assert "started a new one" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
        _end_leftovers(pids + list(lost))


def test_a_reaper_that_keeps_dying_stops_the_job_with_its_cause(tmp_path: Path) -> None:
    """The reaper killed again each time it is replaced: the launcher stops the job, names why, leaves nothing."""
    job = write_job(tmp_path, script="with_children.py", args=[str(tmp_path), "stay"], grace_period=1)
    proc = start_cli("run", str(job))
    pids: list[int] = []
    killed: list[int] = []
    try:
        pids = _job_pids(tmp_path)
        while proc.poll() is None and len(killed) < 10:
            assert wait_for(lambda: bool(_reapers_of(proc.pid) - set(killed)) or proc.poll() is not None,
                            timeout=120), f"no new reaper after {len(killed)} kill(s) of one"
            for pid in _reapers_of(proc.pid) - set(killed):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        _out, err = proc.communicate(timeout=300)
        from clusterddp.launch.teardown.reaper import REPLACEMENTS
        assert len(killed) == REPLACEMENTS + 1, killed
        assert proc.returncode == 1, err
        assert f"stopped: the reaper (pid {killed[-1]}) was killed by SIGKILL" in err, err
        assert wait_for(lambda: not any(_alive(p) for p in pids), timeout=120), [p for p in pids if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
        _end_leftovers(pids + killed)


# -- timing promises ---------------------------------------------------------------------------

def test_hang_timeout_fires_when_the_stuck_rank_never_printed(tmp_path: Path) -> None:
    """Rank 0 never prints, rank 1 exits silently: hang_timeout still fires (exit 124), counted from that exit."""
    job = write_job(tmp_path, script="silent.py", hang_timeout=1.5, grace_period=1)
    result = cli("run", str(job), timeout=600)
    assert result.returncode == 124, result.stderr
    assert "hang: no rank made progress" in result.stderr


def test_teardown_waits_the_grace_period_then_ends(tmp_path: Path) -> None:
    """Workers that ignore SIGTERM: the launcher waits the grace period after the first SIGTERM, then
    ends them (how soon after it: benchmarks/teardown_latency.py, not a test on a loaded machine)."""
    job = write_job(tmp_path, script="term_stamp.py", args=[str(tmp_path), "0.5"], grace_period=1)
    proc = start_cli("run", str(job))
    proc.communicate(timeout=600)
    ended = time.time()
    assert proc.returncode == 3
    first_term = float((tmp_path / "term0").read_text().split()[0])
    assert ended - first_term >= 0.9, ended - first_term  # a lower bound: load only makes it longer


@pytest.mark.parametrize("read_lines", [1, 0], ids=["head-1", "closed-at-once"])
def test_a_closed_console_never_changes_the_exit_code(tmp_path: Path, read_lines: int) -> None:
    """`run ... 2>&1 | head -1` (or a reader gone at once) with a rank exiting 3: the launcher exits 3."""
    job = write_job(tmp_path, script="exit_with.py", args=["3", "1"], grace_period=1)
    proc = subprocess.Popen([sys.executable, "-m", "clusterddp", "run", str(job)], cwd=REPO, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for _ in range(read_lines):
        proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=600) == 3


def test_a_closed_console_does_not_stop_the_job(tmp_path: Path) -> None:
    """The console closes while the job runs: the workers run to their end and the launcher exits 0."""
    job = write_job(tmp_path, script="print_fast.py", args=["3000"], nproc_per_node=2)
    proc = subprocess.Popen([sys.executable, "-m", "clusterddp", "run", str(job), "--run-id", "closed"],
                            cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=600) == 0
    for rank in (0, 1):
        assert len((tmp_path / "logs" / "closed" / f"rank{rank}.log").read_text().splitlines()) == 3000


# -- files written for the user are whole or not written ----------------------------------------

def _fill(disk: Path) -> None:
    """Write into ``disk`` until it is full (ENOSPC), leaving the filler in place."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_render_on_a_full_disk_keeps_the_old_script(tmp_path: Path, tiny_disk: Path) -> None:
    """render slurm -o on a full disk: exit 2, one line naming the file, the old script byte-identical, no temp file."""
    small = write_job(tmp_path, name="small", script="exit_with.py")
    big = write_job(tmp_path, name="big", script="exit_with.py", slurm={"setup": [f"echo {'x' * 200}"] * 100})
    target = tiny_disk / "job.sbatch"
    assert cli("render", "slurm", str(small), "-o", str(target)).returncode == 0
    old = target.read_bytes()
    _fill(tiny_disk)
    result = cli("render", "slurm", str(big), "-o", str(target))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, (result.returncode, result.stderr)
    assert result.stderr.startswith("clusterddp: error: ") and str(target) in result.stderr
    assert os.strerror(errno.ENOSPC) in result.stderr
    assert target.read_bytes() == old
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler", "job.sbatch"]


def test_append_on_a_full_disk_leaves_no_half_line(tiny_disk: Path) -> None:
    """append_whole (known_hosts under accept_new_host_keys) on a full disk: WriteError, the file byte-identical."""
    from clusterddp.atomicfile import WriteError, append_whole

    known = tiny_disk / "known_hosts"
    known.write_text("node1 ssh-ed25519 AAAA\n")
    _fill(tiny_disk)
    with pytest.raises(WriteError, match=re.escape(os.strerror(errno.ENOSPC))):
        append_whole(known, "node2 ssh-rsa " + "B" * 20000 + "\n")
    assert known.read_text() == "node1 ssh-ed25519 AAAA\n"
