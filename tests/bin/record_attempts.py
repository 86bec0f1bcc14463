"""Write this worker's environment as JSON to argv[1]/rank<RANK>.attempt<TORCHELASTIC_RESTART_COUNT>.json,
wait (up to 60 s) until every rank of this attempt has written its own, so a peer's failure tears
down none unrecorded, then exit 3 while that attempt is below argv[2] (fails on attempts 0..N-1)."""
import json
import os
import sys
import time

out, fail_below = sys.argv[1], int(sys.argv[2])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
path = os.path.join(out, f"rank{os.environ['RANK']}.attempt{attempt}.json")
with open(path + ".tmp", "w") as f:
    json.dump(dict(os.environ), f)
os.rename(path + ".tmp", path)
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not all(
        os.path.exists(os.path.join(out, f"rank{r}.attempt{attempt}.json")) for r in range(int(os.environ["WORLD_SIZE"]))):
    time.sleep(0.01)
sys.exit(3 if attempt < fail_below else 0)
