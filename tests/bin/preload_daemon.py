"""A ``preload:`` module that starts a process in a new session when the warm interpreter
imports it, as a preload's ``subprocess.Popen(..., start_new_session=True)`` would
($PRELOAD_DAEMON_MODE ``setsid``: the zygote's child), or a daemon (``double-fork``: setsid,
double fork), each exec'ing with an EMPTY environment (no marker variable). Its pid goes to
$PRELOAD_DAEMON_DIR/preload_daemon.pid; the import returns once it runs."""
import os
import time

_pidfile = os.path.join(os.environ["PRELOAD_DAEMON_DIR"], "preload_daemon.pid")
_double = os.environ.get("PRELOAD_DAEMON_MODE") == "double-fork"
_first = os.fork()
if _first == 0:
    os.setsid()
    if not _double or os.fork() == 0:
        os.execve("/bin/sh", ["sh", "-c", f"echo $$ > {_pidfile}.tmp && mv {_pidfile}.tmp {_pidfile}; "
                                          "exec sleep 300"], {})
    os._exit(0)
if _double:
    os.waitpid(_first, 0)
while not os.path.exists(_pidfile):
    time.sleep(0.01)
