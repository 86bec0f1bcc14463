"""How soon a stop takes effect: the speed claims the tests no longer make (issue 32 item 17).

A test must pass on a machine at load 30, so it asserts what happens, not how fast; these are
the figures, measured here on whatever machine runs this:

- ``stubborn``: workers that ignore SIGTERM (tests/bin/term_stamp.py, grace_period 1): the
  launcher's exit minus the first SIGTERM a worker saw. Claim: at most grace_period + 0.45 s
  (workers.TEARDOWN_SLACK).
- ``backoff``: SIGTERM to the launcher while it waits out a 4 s backoff between restarts
  (tests/bin/attempt_stamp.py fail): exit 143 how long after the signal. Claim: at once, well
  under the 4 s.
- ``nan``: a NaN loss on rank 1 at step 2 (tests/train/bin/scenarios.py, gloo, 2 ranks,
  CLUSTERDDP_DIST_TIMEOUT 3600): both ranks exit 65; the launcher's whole run, torch imports
  included. Claim: seconds, never the collective timeout.

    .venv/bin/python benchmarks/stop_latency.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "tests" / "bin"
SCENARIOS = REPO / "tests" / "train" / "bin" / "scenarios.py"


def _run(directory: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "clusterddp", "run", "--nproc-per-node", "2", "--log-dir",
            os.path.join(directory, "logs"), *args]


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", CLUSTERDDP_NO_MERGE="1", **extra)


def stubborn(directory: str) -> float:
    """Seconds from the first SIGTERM a worker saw to the launcher's exit (grace_period 1)."""
    done = subprocess.run(_run(directory, "--grace-period", "1", "--", str(BIN / "term_stamp.py"), directory, "0.5"),
                          cwd=REPO, env=_env(), capture_output=True, timeout=600)
    ended = time.time()
    if done.returncode != 3:
        raise SystemExit(f"stubborn: exit {done.returncode}, expected 3:\n{done.stderr.decode()[-2000:]}")
    return ended - float(Path(directory, "term0").read_text().split()[0])


def backoff(directory: str) -> float:
    """Seconds from a SIGTERM during the 4 s backoff to the launcher's exit (143)."""
    proc = subprocess.Popen(_run(directory, "--restarts", "5", "--grace-period", "1", "--",
                                 str(BIN / "attempt_stamp.py"), directory, "fail"),
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "in 4s (restart 4 of 5)" in line:
            break
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=600)
    took = time.monotonic() - sent
    if proc.returncode != 128 + signal.SIGTERM:
        raise SystemExit(f"backoff: exit {proc.returncode}, expected 143")
    return took


def nan(directory: str) -> float:
    """Seconds of the whole run (start to both ranks' exit 65)."""
    started = time.monotonic()
    done = subprocess.run(_run(directory, "--", str(SCENARIOS), "train", directory, "--nan-at-call", "3"),
                          cwd=REPO, env=_env(CLUSTERDDP_DIST_TIMEOUT="3600"), capture_output=True, timeout=3600)
    took = time.monotonic() - started
    if done.returncode != 65:
        raise SystemExit(f"nan: exit {done.returncode}, expected 65:\n{done.stderr.decode()[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, measure in (("stubborn", stubborn), ("backoff", backoff), ("nan", nan)):
            with tempfile.TemporaryDirectory(prefix=f"stop-{name}-") as directory:
                results.setdefault(name, []).append(measure(directory))
    print(f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    print(f"{'case':<9} {'median s':>9} {'max s':>7}  claim")
    claims = {"stubborn": "<= grace 1 + 0.45", "backoff": "well under the 4 s backoff", "nan": "seconds, not 3600"}
    for name, values in results.items():
        print(f"{name:<9} {statistics.median(values):>9.3f} {max(values):>7.3f}  {claims[name]}")


if __name__ == "__main__":
    main()
