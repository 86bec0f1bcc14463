"""Every rank writes its pid to argv[1]/rank<R>.pid, then hangs ignoring SIGTERM if argv[2] == 'stubborn'."""
import os
import signal
import sys
import time

out = sys.argv[1]
if len(sys.argv) > 2 and sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(out, f"rank{os.environ['RANK']}.pid"), "w") as f:
    f.write(str(os.getpid()))
print("hanging", flush=True)
while True:
    time.sleep(1)
