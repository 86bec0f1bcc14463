"""Each rank starts two DataLoader-style children (one leaves the process group), records all
pids in argv[1]/rank<R>.pids, then rank 0 fails so the launcher must reap the trees (with
argv[2] == 'stay' no rank fails: every rank sleeps, so the launcher can be killed; 'stubborn'
is 'stay' with the ranks, not their children, ignoring SIGTERM)."""
import multiprocessing
import os
import signal
import subprocess
import sys
import time


def loader_worker() -> None:
    while True:
        time.sleep(1)


if __name__ == "__main__":
    out = sys.argv[1]
    child = multiprocessing.get_context("fork").Process(target=loader_worker, daemon=False)
    child.start()
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    rank = os.environ["RANK"]
    stay = sys.argv[2] if len(sys.argv) > 2 else None
    if stay == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(out, f"rank{rank}.pids"), "w") as f:
        f.write(f"{os.getpid()} {child.pid} {escaped.pid}")
    time.sleep(1.0)
    if rank == "0" and stay is None:
        os._exit(4)  # a crash: no atexit joins, the children are orphaned
    time.sleep(600)
