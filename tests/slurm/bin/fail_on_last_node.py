"""A worker that fails with exit 3 on the last rank (on the second node) and hangs elsewhere.

The hanging ranks stand for workers blocked in a collective: only the launchers' teardown
and srun's --kill-on-bad-exit can end them.
"""

import os
import sys
import time

if int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1:
    time.sleep(1.0)
    print(f"rank {os.environ['RANK']}: failing on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(600)
