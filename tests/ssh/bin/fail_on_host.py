"""Worker: local rank 0 on host $FAIL_HOST exits $FAIL_CODE after $FAIL_AFTER s; all others wait forever."""

import os
import socket
import sys
import time

print(f"ready rank {os.environ['RANK']} on {socket.gethostname()}", flush=True)
if socket.gethostname() == os.environ["FAIL_HOST"] and os.environ["LOCAL_RANK"] == "0":
    time.sleep(float(os.environ.get("FAIL_AFTER", "2")))
    print(f"FAILING at {time.time():.3f}", flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
while True:
    time.sleep(1)
