"""Attempt 0: print, wait until the directory argv[1] sits on a read-only mount, exit 7.
Later attempts exit 0, or (argv[2] == "always") print a line on stderr and exit 7 again."""
import os
import sys
import time

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {os.environ['RANK']} attempt {attempt}", flush=True)
if attempt == 0:
    deadline = time.monotonic() + 60
    while not os.statvfs(sys.argv[1]).f_flag & os.ST_RDONLY and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(7)
if sys.argv[2:] == ["always"]:
    print(f"attempt {attempt} failed on its own", file=sys.stderr, flush=True)
    sys.exit(7)
