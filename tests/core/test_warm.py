"""Workers forked by the warm interpreter (launch/start/warm.py, zygote.py): real processes, real gloo."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from clusterddp.launch.start import warm
from clusterddp.launch.start.warm import entry_file, imports_torch, wanted
from clusterddp.protocol import STOP_SIGNALS
from tests.conftest import BIN, REPO, cli, cli_env, start_cli, wait_for, write_job

#: What differs between any two runs of one job, warm or cold: the run's id, port, marker, pids.
_PER_RUN = {"MASTER_PORT", "CLUSTERDDP_SUPERVISOR_ID", "pid", "ppid"}


def _probe(tmp_path: Path, warm: bool, parent: Sequence[str] = ()) -> tuple[dict[str, Any], int]:
    """Run probe_self.py on 2 workers; what rank 0 saw (run id made neutral) and the launcher's
    pid. ``parent``: a command the launcher is started under (``nohup``)."""
    tag = "warm" if warm else "cold"
    job = write_job(tmp_path, name=tag, script="probe_self.py", args=[str(tmp_path), "x"], warm_start=warm)
    proc = subprocess.Popen([*parent, sys.executable, "-m", "clusterddp", "run", str(job), "--run-id", f"probe-{tag}"],
                            cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "warm start off" not in err
    text = (tmp_path / "rank0.x.json").read_text().replace(f"probe-{tag}", "RUN")
    seen = json.loads(text)
    seen["rank1_hash"] = json.loads((tmp_path / "rank1.x.json").read_text())["hash"]
    os.unlink(tmp_path / "rank0.x.json")
    return seen, proc.pid


def test_a_warm_worker_cannot_be_told_from_a_cold_one(tmp_path: Path) -> None:
    """argv, __main__, sys.path, env, signals, fds, cwd, umask, session, parent, PDEATHSIG, modules: the same warm and cold."""
    cold, cold_launcher = _probe(tmp_path, warm=False)
    warm, warm_launcher = _probe(tmp_path, warm=True)
    assert cold["ppid"] == cold_launcher and warm["ppid"] == warm_launcher  # the launcher's child, both
    assert warm["pdeathsig"] == cold["pdeathsig"] == signal.SIGKILL
    assert warm["session_leader"] and warm["group_leader"]
    assert "zygote.py" in " ".join(warm["cmdline"]) and "bootstrap.py" in " ".join(cold["cmdline"])
    # What differs, by design (docs/warm-start.md): /proc/self/cmdline names the zygote, the
    # ranks of one warm node share the str hash secret (one interpreter's), __loader__'s address.
    assert warm["hash"] == warm["rank1_hash"]
    assert cold["hash"] != cold["rank1_hash"]
    for seen in (cold, warm):
        for key in ("cmdline", "hash", "rank1_hash", *_PER_RUN):
            seen.pop(key, None)
        seen["env"] = {k: v for k, v in seen["env"].items() if k not in _PER_RUN}
        seen["main"]["__loader__"] = seen["main"]["__loader__"].split(" object at ")[0]
    assert set(warm["modules"]) == set(cold["modules"]), (set(warm["modules"]) ^ set(cold["modules"]))
    for key in cold:
        assert warm[key] == cold[key], key


#: Parents that leave a process some signals ignored: ``nohup`` (SIGHUP), and a shell that
#: starts it as a background job (SIGINT, SIGQUIT: POSIX, job control off).
_PARENTS = {
    "nohup": (["nohup"], {"SIGHUP"}),
    "sh-background": (["sh", "-c", '"$@" & wait $!', "sh"], {"SIGINT", "SIGQUIT"}),
}


def _ignored(seen: dict[str, Any]) -> set[str]:
    return {name for name, handler in seen["signals"].items() if "SIG_IGN" in handler}


def _plain(tmp_path: Path, parent: Sequence[str]) -> dict[str, Any]:
    """What probe_self.py saw run as ``python script.py`` (world of 1) under ``parent``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = cli_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    done = subprocess.run([*parent, sys.executable, str(BIN / "probe_self.py"), str(tmp_path), "plain"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return dict(json.loads((tmp_path / "rank0.plain.json").read_text()))


@pytest.mark.parametrize("parent", sorted(_PARENTS))
def test_workers_keep_the_signals_the_launcher_inherited(tmp_path: Path, parent: str) -> None:
    """Under nohup, or as a shell's background job: warm and cold workers ignore what `python
    script.py` ignores there, and no more, but for the stop signals: the launcher owns those
    and stops its workers with them, so a worker has them at default (sigstart.KEPT_IGNORED)."""
    command, ignored_by_parent = _PARENTS[parent]
    plain = _plain(tmp_path, command)
    assert ignored_by_parent <= _ignored(plain)  # the parent did leave them ignored
    cold, _ = _probe(tmp_path, warm=False, parent=command)
    warm, _ = _probe(tmp_path, warm=True, parent=command)
    owned = {signal.Signals(sig).name for sig in STOP_SIGNALS}
    owned_mask = sum(1 << (sig - 1) for sig in STOP_SIGNALS)
    for seen in (cold, warm):
        assert _ignored(seen) == _ignored(plain) - owned
        assert int(seen["sig_status"]["SigIgn"], 16) == int(plain["sig_status"]["SigIgn"], 16) & ~owned_mask
    assert warm["signals"] == cold["signals"]
    assert warm["sig_status"] == cold["sig_status"]


def _zygote_of(launcher: int) -> int | None:
    """The launcher's child running zygote.py."""
    try:
        children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    except OSError:
        return None
    for pid in children:
        try:
            if b"zygote.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        except OSError:
            continue
    return None


def _idle(zygote: int) -> bool:
    """The zygote waits for a request: every answer sent (no intermediate left, blocked reading its socket)."""
    try:
        children = Path(f"/proc/{zygote}/task/{zygote}/children").read_text().split()
        wchan = Path(f"/proc/{zygote}/wchan").read_text()
    except OSError:
        return False
    return not children and wchan in ("unix_stream_read_generic", "0", "")  # "0": the kernel hides it


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def _attempt(tmp_path: Path, rank: int, attempt: int) -> dict[str, Any]:
    return dict(json.loads((tmp_path / f"rank{rank}.attempt{attempt}.json").read_text()))


@pytest.mark.parametrize("signum, why", [
    # the request may reach a zygote still on its way out (it then goes unanswered): either way
    (signal.SIGKILL, r"it was killed by SIGKILL (before a fork|while forking a worker)"),
    (signal.SIGSTOP, r"no answer to a fork within 10 s"),
])
def test_a_killed_or_stopped_zygote_falls_back_to_a_cold_start(tmp_path: Path, signum: int, why: str) -> None:
    """The zygote SIGKILLed or SIGSTOPped before a restart: one line, the next attempt starts cold and succeeds, nothing left running."""
    job = write_job(tmp_path, script="warm_attempts.py", args=[str(tmp_path)], restarts=1)
    proc = start_cli("run", str(job))
    try:
        # both ranks' records written before rank 1 dies: on a loaded machine rank 0 could
        # still be on its way there, and be stopped before it wrote its own
        assert wait_for(lambda: all((tmp_path / f"rank{r}.attempt0.json").exists() for r in (0, 1)), 600)
        zygote = _zygote_of(proc.pid)
        assert zygote is not None
        # every answer sent: the zygote is lost before the next attempt, not between a fork
        # and its reply (that case: test_a_zygote_lost_between_a_fork_and_its_reply...)
        assert wait_for(lambda: _idle(zygote), 30)
        os.kill(zygote, signum)
        (tmp_path / "go").touch()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "killed by SIGKILL" in err  # rank 1's own death, seen as for a cold worker
    assert err.count("warm start off") == 1, err
    assert re.search(rf"warm start off \({why}\): starting workers cold", err), err
    assert all("zygote.py" in " ".join(_attempt(tmp_path, r, 0)["cmdline"]) for r in (0, 1))
    assert all("bootstrap.py" in " ".join(_attempt(tmp_path, r, 1)["cmdline"]) for r in (0, 1))
    assert _gone(zygote) and all(_gone(_attempt(tmp_path, r, a)["pid"]) for r in (0, 1) for a in (0, 1))


def test_the_zygote_starts_before_the_worker_group(tmp_path: Path) -> None:
    """The zygote is started once the job is planned (warm.prestart), before the reaper, and it is the one that serves the workers."""
    job = write_job(tmp_path, script="warm_attempts.py", args=[str(tmp_path), "wait"])
    proc = start_cli("run", str(job))
    try:
        assert wait_for(lambda: all((tmp_path / f"rank{r}.attempt0.json").exists() for r in (0, 1)), 120)
        zygote = _zygote_of(proc.pid)
        launcher = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        children = [int(pid) for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        reapers = [pid for pid in children if Path(f"/proc/{pid}/cmdline").read_bytes() == launcher]
        assert zygote is not None and len(reapers) == 1
        # pids grow: the zygote is older than the reaper, the group's first act (a zygote
        # started by the group instead, after a prestarted one was refused, would be younger)
        assert zygote < reapers[0]
        assert all(_attempt(tmp_path, r, 0)["ppid"] == proc.pid for r in (0, 1))
    finally:
        proc.kill()  # rank 1 waits for a "go" that never comes
        _, err = proc.communicate()
    assert "warm start off" not in err


@pytest.mark.parametrize("count, shares", [(1, [1]), (2, [1, 1]), (4, [2, 2]), (5, [2, 2, 1]), (8, [3, 3, 2]),
                                           (9, [3, 3, 3])])
def test_an_attempts_requests_are_shared_over_about_sqrt_n_intermediates(count: int, shares: list[int]) -> None:
    """The zygote forks about sqrt(n) intermediates for n workers, each forking a run of them in order."""
    from clusterddp.launch.start import zygote

    assert [len(share) for share in zygote._shares(list(range(count)))] == shares
    assert [x for share in zygote._shares(list(range(count))) for x in share] == list(range(count))


def test_five_warm_workers_from_three_intermediates(tmp_path: Path) -> None:
    """5 workers (intermediates forking 2, 2 and 1): each its own process, the launcher's child, in its own session, with its rank."""
    job = write_job(tmp_path, script="warm_attempts.py", args=[str(tmp_path), "wait"], nproc_per_node=5)
    proc = start_cli("run", str(job))
    try:
        assert wait_for(lambda: all((tmp_path / f"rank{r}.attempt0.json").exists() for r in range(5)), 120)
        seen = [_attempt(tmp_path, r, 0) for r in range(5)]
        assert len({s["pid"] for s in seen}) == 5 and all(s["ppid"] == proc.pid for s in seen)
        assert all("zygote.py" in " ".join(s["cmdline"]) for s in seen)
        assert all(os.getsid(s["pid"]) == s["pid"] for s in seen)
    finally:
        proc.kill()  # rank 1 waits for a "go" that never comes
        _, err = proc.communicate()
    assert "warm start off" not in err


def test_a_prestarted_zygote_serves_only_the_same_start(tmp_path: Path) -> None:
    """take_prestarted returns the zygote started with the same interpreter, environment and preloads; any other is stopped."""
    env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    warm.prestart(sys.executable, env, (), str(tmp_path / "zygote.log"))
    first = warm._prestarted[0]
    assert warm.take_prestarted(sys.executable, env, ()) is first
    first.close()
    warm.prestart(sys.executable, env, (), str(tmp_path / "zygote.log"))
    second = warm._prestarted[0]
    assert warm.take_prestarted(sys.executable, {**env, "OMP_NUM_THREADS": "2"}, ()) is None
    assert second.proc.poll() is not None and not warm._prestarted  # stopped, not left for later
    warm.prestart(sys.executable, env, (), str(tmp_path / "zygote.log"))
    third = warm._prestarted[0]
    warm.drop_prestarted()
    assert third.proc.poll() is not None and warm.take_prestarted(sys.executable, env, ()) is None


def test_workers_and_zygote_die_with_a_launcher_killed_by_sigkill(tmp_path: Path) -> None:
    """kill -9 of the launcher: the warm workers and the zygote are gone within seconds."""
    job = write_job(tmp_path, script="warm_attempts.py", args=[str(tmp_path), "wait"])
    proc = start_cli("run", str(job))
    try:
        assert wait_for(lambda: all((tmp_path / f"rank{r}.attempt0.json").exists() for r in (0, 1)), 120)
        zygote = _zygote_of(proc.pid)
        assert zygote is not None
        workers = [_attempt(tmp_path, r, 0)["pid"] for r in (0, 1)]
        assert all(_attempt(tmp_path, r, 0)["ppid"] == proc.pid for r in (0, 1))
        proc.kill()
        proc.communicate()
        assert wait_for(lambda: _gone(zygote) and all(_gone(w) for w in workers), 10)
    finally:
        (tmp_path / "end").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("module, why", [
    ("starts_thread", "preload starts_thread started a Python thread (1 running)"),
    ("no_such_module_here", "preload no_such_module_here: ModuleNotFoundError: No module named 'no_such_module_here'"),
])
def test_an_unsafe_or_missing_preload_starts_cold(tmp_path: Path, module: str, why: str) -> None:
    """A preload that starts a thread, or fails to import: one line saying why, the workers start cold and succeed."""
    (tmp_path / "starts_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    job = write_job(tmp_path, script="probe_self.py", args=[str(tmp_path), "x"], preload=[module],
                    env={"PYTHONPATH": str(tmp_path)})
    result = cli("run", str(job), timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("warm start off") == 1
    assert f"warm start off ({why}): starting workers cold" in result.stderr
    assert "bootstrap.py" in " ".join(json.loads((tmp_path / "rank0.x.json").read_text())["cmdline"])


@pytest.mark.parametrize("mode, source, preload, expected", [
    ("auto", "import torch\n", (), True),
    ("auto", "from torch import nn\n", (), True),
    ("auto", "def main():\n    import torch.distributed as dist\n", (), True),
    ("auto", "import torchvision_like\nimport os\n", (), False),
    ("auto", "import os\n", ("torchvision",), True),
    (False, "import torch\n", ("torchvision",), False),
    (True, "import os\n", (), True),
])
def test_warm_start_auto(tmp_path: Path, mode: bool | str, source: str, preload: tuple[str, ...],
                         expected: bool) -> None:
    """auto forks when the entry imports torch itself or preload is given; true and false decide alone."""
    (tmp_path / "train.py").write_text(source)
    assert wanted(mode, ["train.py", "--x"], str(tmp_path), preload) is expected


def test_entry_file_of_a_module(tmp_path: Path) -> None:
    """-m pkg.train is found as pkg/train.py (or pkg/train/__main__.py) under the workdir, without importing it."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import torch\n")
    assert entry_file(["-m", "pkg.train"], str(tmp_path)) == str(tmp_path / "pkg" / "train.py")
    assert imports_torch(entry_file(["-m", "pkg.train"], str(tmp_path)))
    assert entry_file(["-m", "nowhere"], str(tmp_path)) is None
    assert not imports_torch(str(BIN / "exit_with.py"))


def test_restart_count_and_new_pids_per_attempt(tmp_path: Path) -> None:
    """Each attempt's warm workers are new processes, the launcher's children, with their attempt's TORCHELASTIC_RESTART_COUNT."""
    job = write_job(tmp_path, script="warm_attempts.py", args=[str(tmp_path)], restarts=1)
    proc = start_cli("run", str(job))
    try:
        assert wait_for(lambda: (tmp_path / "rank1.attempt0.json").exists(), 120)
        (tmp_path / "go").touch()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "warm start off" not in err
    seen = [_attempt(tmp_path, r, a) for r in (0, 1) for a in (0, 1)]
    assert len({s["pid"] for s in seen}) == 4 and all(s["ppid"] == proc.pid for s in seen)
    assert all("zygote.py" in " ".join(s["cmdline"]) for s in seen)
    assert "restarting the local group in 0s (restart 1 of 1)" in err


def test_a_failing_warm_worker_reports_as_a_cold_one(tmp_path: Path) -> None:
    """An uncaught exception: the same exit code, traceback and output in the rank's log, warm and cold."""
    logs = {}
    for warm in (False, True):
        job = write_job(tmp_path, name=f"w{warm}", script="raise_after_torch.py", args=["boom"], warm_start=warm,
                        nproc_per_node=1)  # one worker: no peer torn down before it wrote
        result = cli("run", str(job), "--run-id", f"r{warm}", timeout=180)
        assert result.returncode == 1, result.stderr
        assert ("warm start off" in result.stderr) is False
        # stdout and stderr are two pipes: their lines may interleave either way, warm or cold
        logs[warm] = sorted((tmp_path / "logs" / f"r{warm}" / "rank0.log").read_text().splitlines())
    assert logs[True] == logs[False]
    text = "\n".join(logs[True])
    assert "ValueError: boom" in text and "before the error" in text and "zygote" not in text and "bootstrap" not in text


@pytest.mark.parametrize("signum, why", [
    (signal.SIGKILL, "it was killed by SIGKILL while forking a worker"),
    (signal.SIGSTOP, "no answer to a fork within 10 s"),
])
def test_a_zygote_lost_between_a_fork_and_its_reply_runs_no_rank_twice(tmp_path: Path, signum: int, why: str) -> None:
    """The zygote killed or stopped (test hook) once both workers are forked, after its reply for rank 0 and
    before the one for rank 1: rank 0 runs warm, rank 1 cold, each once; rank 1's forked worker runs nothing."""
    job = write_job(tmp_path, script="rank_once.py", args=[str(tmp_path)],
                    env={"CLUSTERDDP_TEST_ZYGOTE_SIGNAL": str(int(signum))})
    result = cli("run", str(job), "--run-id", "lost", timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("warm start off") == 1, result.stderr
    assert f"clusterddp: warm start off ({why}): starting workers cold" in result.stderr, result.stderr
    hook = re.search(r"CLUSTERDDP_TEST_ZYGOTE_SIGNAL: zygote (\d+), workers (\d+)$",
                     (tmp_path / "logs" / "lost" / "zygote.node0.log").read_text(), re.M)
    assert hook is not None  # the hook fired, with rank 1's forked worker set up
    zygote, stray = int(hook[1]), int(hook[2])
    runs = sorted(tuple(line.split()) for line in (tmp_path / "ranks.txt").read_text().splitlines())
    assert [(rank, how) for rank, _pid, how in runs] == [("0", "warm"), ("1", "cold")], runs
    assert str(stray) not in [pid for _rank, pid, _how in runs]
    assert all(_gone(pid) for pid in (zygote, stray, *(int(pid) for _rank, pid, _how in runs)))
