"""Starts a daemon that escapes everything but a cgroup or a subreaper: setsid, double fork,
execve with an EMPTY environment (no marker variable), keeping the worker's stdout/stderr pipes
open. The daemon's pid goes to argv[1]/daemon<R>.pid; the worker then exits 0, or with
argv[2] == 'stay' sleeps (so the launcher can be killed)."""
import os
import sys
import time

out = sys.argv[1]
rank = os.environ["RANK"]
pidfile = os.path.join(out, f"daemon{rank}.pid")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve("/bin/sh", ["sh", "-c", f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 300"], {})
    os._exit(0)
while not os.path.exists(pidfile):
    time.sleep(0.01)
print(f"rank {rank} started a daemon", flush=True)
if len(sys.argv) > 2 and sys.argv[2] == "stay":
    time.sleep(600)
time.sleep(0.3)
