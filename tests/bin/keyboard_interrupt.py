"""Write argv[1]/rank<R>.ready, print 'ready rank R', then wait: the KeyboardInterrupt of a
SIGINT writes rank<R>.interrupted (and is re-raised), a SIGTERM writes rank<R>.terminated."""
import os
import signal
import socket
import sys
import time

out, rank = sys.argv[1], os.environ["RANK"]


def note(what: str) -> None:
    with open(os.path.join(out, f"rank{rank}.{what}"), "w") as f:
        f.write(f"{os.getpid()}\n")


def on_term(_signum: int, _frame: object) -> None:
    note("terminated")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
note("ready")
print(f"ready rank {rank} on {socket.gethostname()}", flush=True)
try:
    while True:
        time.sleep(0.1)
except KeyboardInterrupt:
    note("interrupted")  # where a script saves its checkpoint on Ctrl-C
    raise
