"""Rank 0 sleeps without ever printing a line; the other ranks exit 0 at once, silently."""
import os
import time

if os.environ["RANK"] == "0":
    time.sleep(600)
