"""Worker: prints its rank and host, then exits 0 (the benchmark's trivial job)."""

import os
import socket

print(f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')} on {socket.gethostname()}", flush=True)
