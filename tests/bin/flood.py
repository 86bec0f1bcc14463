"""Every rank prints argv[1] MiB of 1 KiB lines on stdout; rank argv[2] (if given) then
writes one line to stderr and exits 3. For a log directory on a full disk."""
import os
import sys

rank = int(os.environ["RANK"])
line = f"r{rank} ".encode() + b"x" * (1020 - len(str(rank))) + b"\n"
out = sys.stdout.buffer
for _ in range(int(float(sys.argv[1]) * 1024)):
    out.write(line)
out.flush()
if len(sys.argv) > 2 and rank == int(sys.argv[2]):
    print(f"rank {rank} failed: the disk was not the cause", file=sys.stderr, flush=True)
    sys.exit(3)
