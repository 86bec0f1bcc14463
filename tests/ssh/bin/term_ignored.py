"""Worker: rank 0 ignores SIGTERM and says so (it must be stopped by SIGKILL or a signal the head
names); every other rank waits for rank 0's word in argv[1]/ready, then exits 3."""
import os
import signal
import sys
import time

out = sys.argv[1]
if os.environ["RANK"] == "0":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(out, "ready"), "w").close()
    print("rank 0 ignores SIGTERM", flush=True)
    while True:
        time.sleep(0.1)
while not os.path.exists(os.path.join(out, "ready")):
    time.sleep(0.02)
sys.exit(3)
