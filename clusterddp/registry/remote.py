"""What a detached SSH run's head host does for the machine that typed ``run --detach``.

The head of a detached SSH run lives on a host of the hostfile (``launch.remotehead``), so the
typing machine keeps only a record of where it went and asks that host for the rest. Each
function here runs *on that host*, started over SSH as ``PYTHON -c 'from
clusterddp.registry.remote import NAME; NAME()' ARGS`` (preflight already needs clusterddp
importable there), and talks to the typing side in JSON lines on stdout:

- ``boot``: start the head in its own session (``setsid``; stdin /dev/null; stdout and stderr
  appended to its console file in the run dir on that host; the environment the typing side
  sent on stdin, so no value reaches a command line; its registry that host's own, off the log
  disk, so a full log disk does not cost the record of the run's end); then report the head's
  identity and registry, its ``launcher.json`` once it is written, and its exit code if it
  ends while the typing side still waits. The typing side closing stdin (done, or killed) ends ``boot`` only.
- ``count``: the processes running a rank of a run in this host's network namespace, each
  time that number changes, until stdin closes.
- ``answer``: each asked run's row (``view.live`` judged here, where its head's pid means
  something) from the head's registry there: one call for all the runs of a host.
- ``command``: ``clusterddp ACTION RUN ...`` with that registry (``attach``, ``logs``,
  ``stop``), ended when the typing side closes stdin (Ctrl-C on ``attach``), so nothing of it
  outlives the one who asked.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

#: Seconds between two looks (for the head's end, for ranks, for launcher.json).
POLL = 0.05
#: Where the detached head's registry goes on its host, when the typing side says (else that
#: host's own registry, ``store.home()`` in its login environment).
HEAD_HOME_ENV = "CLUSTERDDP_HEAD_HOME"


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _stdin_closed(timeout: float) -> bool:
    """True once the typing side has closed stdin (or sent anything: it is done)."""
    ready, _, _ = select.select([0], [], [], timeout)
    if ready:
        os.read(0, 4096)
    return bool(ready)


def boot() -> None:
    """Start the head (see the module's docstring); its identity, launcher.json, early end."""
    from clusterddp.procid import ProcessIdentity, boot_id, start_time
    from clusterddp.protocol import BadLauncherFile, read_launcher_file
    from clusterddp.registry import store

    request = json.loads(sys.stdin.readline())
    console, run_dir = str(request["console"]), str(request["run_dir"])
    try:
        os.makedirs(run_dir, exist_ok=True)
        fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError as exc:
        _say({"error": f"cannot create the console file {console}: {exc.strerror}"})
        return
    env = {**os.environ, **{str(k): str(v) for k, v in request["env"].items()}}
    home = str(request.get("home") or store.home(os.environ))
    env[store.HOME_ENV] = home
    pid = os.fork()
    if pid == 0:  # the head: its own session, no terminal, console to the file
        try:
            os.setsid()
            os.dup2(null, 0)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(str(request["cwd"]))
            os.execve(request["argv"][0], [str(a) for a in request["argv"]], env)
        except OSError as exc:
            os.write(2, f"clusterddp: cannot start the detached head: {exc}\n".encode())
        os._exit(127)
    os.close(fd)
    os.close(null)
    me = ProcessIdentity(pid, start_time(pid), boot_id(), os.uname().nodename)
    _say({"head": {**me.as_record(), "host": me.host}, "home": home})
    told = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _say({"ended": os.waitstatus_to_exitcode(status)})
            return
        if not told:
            try:
                launcher = read_launcher_file(run_dir)
            except BadLauncherFile:
                launcher = None
            if launcher is not None and launcher.get("pid") == pid and isinstance(launcher.get("hosts"), list):
                _say({"launcher": launcher})
                told = True
        if _stdin_closed(POLL):
            return  # the head goes on, a child of init now


def count() -> None:
    """``count RUN_ID``: how many ranks of the run run here, each time that changes."""
    from clusterddp.registry.detach import rank_processes

    run_id, last = sys.argv[1], -1
    while True:
        now = rank_processes(run_id, same_netns=True)
        if now != last:
            _say({"ranks": now})
            last = now
        if _stdin_closed(POLL):
            return


def answer() -> None:
    """``answer`` with ``[[home, run_id], ...]`` on stdin: one JSON line per run, its row
    judged here (``view.live``), or ``{"run_id", "error"}``."""
    from clusterddp.errors import ClusterDDPError
    from clusterddp.registry import store
    from clusterddp.registry.view import live

    for home, run_id in json.loads(sys.stdin.readline()):
        try:
            row = live(store.find(str(run_id), {store.HOME_ENV: str(home)}))
        except ClusterDDPError as exc:
            _say({"run_id": run_id, "error": str(exc)})
            continue
        r = row.record
        _say({"run_id": run_id, "state": row.state, "note": row.note, "attempts": row.attempts,
              "exit_code": r.exit_code, "root_cause": row.root_cause, "goodput": row.goodput, "ended": r.ended})


def command() -> None:
    """``command HOME ACTION RUN ...``: that ``clusterddp`` command with the head's registry;
    its exit code; ended (SIGTERM) when stdin closes first."""
    home, argv = sys.argv[1], sys.argv[2:]
    child = subprocess.Popen([sys.executable, "-m", "clusterddp", *argv], stdin=subprocess.DEVNULL,
                             env={**os.environ, "CLUSTERDDP_HOME": home})

    def watch() -> None:
        while child.poll() is None:
            if _stdin_closed(0.2):
                child.send_signal(signal.SIGTERM)
                time.sleep(1.0)
                if child.poll() is None:
                    child.kill()
                return

    threading.Thread(target=watch, daemon=True).start()
    sys.exit(child.wait())
