"""Write argv[1]/rank<R>.ready, then wait for SIGUSR1 and exit 0 when it arrives."""
import os
import signal
import sys
import time

got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.ready"), "w").close()
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.05)
print("got SIGUSR1" if got else "no signal", flush=True)
sys.exit(0 if got else 1)
