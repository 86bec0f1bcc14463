"""``clusterddp run --detach`` (local runs) and ``clusterddp attach RUN``.

Detach: the command starts the same ``clusterddp run`` again as a child in a new session
(``setsid``: no controlling terminal, so a closed terminal's SIGHUP never reaches it), its
stdin from /dev/null and its stdout and stderr into ``<run dir>/console.log`` (the console
exactly as ``run`` prints it: merged and prefixed). That child is an ordinary local launcher:
it records itself in the registry, supervises, restarts, and records its end. The command
returns once every rank of the first attempt runs (its processes are found in /proc by the
run id the launcher gives them), or, when the child ends first (a refusal), prints the
child's console and exits with its code.

Attach: the console file from its first line, then what is appended, until the launcher has
ended; the exit code is the run's, from its record. Ctrl-C ends ``attach`` only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Mapping, Sequence

from clusterddp.errors import ClusterDDPError
from clusterddp.protocol import BadLauncherFile, read_launcher_file
from clusterddp.registry import store
from clusterddp.registry.logs import Source, show
from clusterddp.registry.store import RunRecord
from clusterddp.registry.view import live, zombie
from clusterddp.validate import clip

#: Set in the detached launcher's environment: it must not detach again (``detach: true`` in
#: its job file), and records where its console goes. Removed before any worker starts.
DETACHED_ENV = "CLUSTERDDP_DETACHED_CONSOLE"
CONSOLE_FILE = "console.log"
#: Seconds between two looks for the ranks.
POLL = 0.02


def start(argv: Sequence[str], run_dir: str, env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """The launcher ``argv`` in a new session, its console in ``run_dir/console.log``."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        console = os.path.join(run_dir, CONSOLE_FILE)
        fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ClusterDDPError(f"--detach: cannot create the console file in {clip(run_dir, 200)}: "
                              f"{exc.strerror}") from None
    try:
        with open(os.devnull, "rb") as null:
            proc = subprocess.Popen(list(argv), stdin=null, stdout=fd, stderr=fd, start_new_session=True,
                                    env={**env, DETACHED_ENV: console})
    finally:
        os.close(fd)
    return proc, console


def _environ_has(pid: str, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(4096)
    except OSError:
        return b""


def _parent(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read(4096).rpartition(b")")[2].split()[1].decode()
    except (OSError, IndexError):
        return ""


def _netns(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _zygote_itself(pid: str) -> bool:
    """A process with the zygote's command line is the zygote, not a worker it forked, when its
    stdout is its own log (``zygote.node<N>.log``); a forked worker writes to the launcher's
    pipe. Where fd 1 cannot be read: when its parent is not a zygote (a forked worker's parent
    may be the zygote, or the launcher once reparented, so this is the weaker rule)."""
    try:
        out = os.path.basename(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:
        return b"zygote" not in _cmdline(_parent(pid))
    return out.startswith("zygote") and out.endswith(".log")


def rank_processes(run_id: str, same_netns: bool = False) -> int:
    """Processes running a rank of ``run_id`` (the launcher gives each worker
    ``TORCHELASTIC_RUN_ID``); a warm start's zygote is not one, the workers it forks are.
    ``same_netns``: only those in this process's network namespace (a host's own ranks where
    hosts share a pid space, as the SSH test bed's namespaces do)."""
    needle = f"TORCHELASTIC_RUN_ID={run_id}".encode()
    mine = _netns("self") if same_netns else ""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or not _environ_has(pid, needle) or zombie(int(pid)):
            continue
        if same_netns and _netns(pid) != mine:
            continue
        if b"zygote" in _cmdline(pid) and _zygote_itself(pid):
            continue  # the zygote: the workers it forks (same command line, same environ) are the ranks
        count += 1
    return count


def wait_running(proc: subprocess.Popen[bytes], run_id: str, run_dir: str) -> bool:
    """True once every rank of the launcher's first attempt runs; False when it ended first."""
    while proc.poll() is None:
        try:
            launcher = read_launcher_file(run_dir)
        except BadLauncherFile:
            launcher = None
        ranks = launcher.get("ranks") if launcher else None
        if isinstance(ranks, list) and ranks and rank_processes(run_id) >= len(ranks):
            return True
        time.sleep(POLL)
    return False


def attach(record: RunRecord) -> int:
    """Print the run's console from its first line and follow it to the run's end; the run's
    exit code. Ctrl-C leaves the run going."""
    if not record.console:
        raise ClusterDDPError(f"attach: run {record.run_id} was not detached: its console went to the terminal "
                              "that started it", f"'clusterddp logs {record.run_id}' prints its ranks' logs")
    def alive() -> bool:
        latest = _latest(record)
        return latest.state not in store.FINAL and live(latest).state not in store.FINAL

    try:
        show([Source("", record.console)], True, alive)
    except KeyboardInterrupt:
        print(f"\nclusterddp: detached from run {record.run_id}; it goes on ('clusterddp attach {record.run_id}' "
              "to follow it again)", file=sys.stderr)
        return 0
    final = _latest(record)
    if final.exit_code is None:
        row = live(final)
        print(f"clusterddp: run {record.run_id} is {row.state}: {row.note or 'no exit code recorded'}", file=sys.stderr)
        return 1
    return final.exit_code


def _latest(record: RunRecord) -> RunRecord:
    try:
        return store.find(record.run_id)
    except ClusterDDPError:
        return record
