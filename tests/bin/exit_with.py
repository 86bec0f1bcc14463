"""Exit with argv[1] on the rank in argv[2] (default: every rank); others wait to be stopped."""
import os
import sys
import time

code = int(sys.argv[1])
failing = int(sys.argv[2]) if len(sys.argv) > 2 else None
rank = int(os.environ["RANK"])
if failing is None or rank == failing:
    print(f"rank {rank} exiting with {code}", file=sys.stderr, flush=True)
    sys.exit(code)
time.sleep(600)
