"""Worker: says it is ready, then waits forever (for signal, kill and link-cut tests)."""

import os
import socket
import time

print(f"ready rank {os.environ['RANK']} on {socket.gethostname()}", flush=True)
while True:
    time.sleep(1)
