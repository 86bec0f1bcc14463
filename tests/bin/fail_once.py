"""Rank 1 fails on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0), then all succeed."""
import os
import sys

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {os.environ['RANK']} attempt {restart}", flush=True)
if restart == 0 and os.environ["RANK"] == "1":
    sys.exit(7)
