"""A job with a known timeline for the report's ground truth; no torch.

argv: STEPS STEP_S EVERY CKPT_S KILL_AT START_SLEEP STATE TRUTH. Every attempt sleeps
START_SLEEP (a planned start-up), resumes after the step in STATE (the last checkpoint), and
runs steps of STEP_S seconds numbered across attempts (the progress record's step), with a
"checkpoint" phase of CKPT_S after every EVERY-th step (not after the last) that writes the
step to STATE. Attempt 0 SIGKILLs itself after step KILL_AT. TRUTH gets one JSON line per
fact, with wall times, for the test to compare the report with.
"""
import json
import os
import signal
import sys
import time

from clusterddp.train import heartbeat, phase

steps, step_s, every, ckpt_s, kill_at, start_sleep = (
    int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]),
    float(sys.argv[6]))
state, truth = sys.argv[7], sys.argv[8]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def tell(**fact: object) -> None:
    with open(truth, "a") as f:
        f.write(json.dumps({"attempt": attempt, "t": time.time(), **fact}) + "\n")


time.sleep(start_sleep)
resumed = int(open(state).read()) if os.path.exists(state) else 0
tell(fact="training_begins", resumed=resumed)
for n in range(resumed + 1, steps + 1):
    time.sleep(step_s)
    heartbeat(step=n)
    if n % every == 0 and n < steps:
        with phase("checkpoint"):
            time.sleep(ckpt_s)
            with open(state + ".tmp", "w") as f:
                f.write(str(n))
            os.replace(state + ".tmp", state)
        tell(fact="checkpoint", step=n)
    if attempt == 0 and n == kill_at:
        tell(fact="killed", step=n)
        os.kill(os.getpid(), signal.SIGKILL)
tell(fact="done")
