"""Steps with heartbeats and phases, no torch; argv: STEPS STEP_S. Attempt 0 checkpoints after 5 steps
(0.6 s), then SIGKILLs itself; attempt 1 evaluates (0.4 s) after 5 steps, then finishes; attempt 0 of
a job with hang_timeout prints and sleeps instead of dying when argv[3] is 'hang'."""
import os
import signal
import sys
import time

from clusterddp.train import heartbeat, phase

steps, step_s = int(sys.argv[1]), float(sys.argv[2])
hang = len(sys.argv) > 3 and sys.argv[3] == "hang"
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for n in range(1, steps + 1):
    time.sleep(step_s)
    heartbeat()
    if n == 5:
        with phase("checkpoint" if attempt == 0 else "eval"):
            time.sleep(0.6 if attempt == 0 else 0.4)
if attempt == 0:
    if hang:
        print("stuck", flush=True)
        time.sleep(60)
    os.kill(os.getpid(), signal.SIGKILL)
