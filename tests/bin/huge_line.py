"""Rank 0 prints one line of argv[1] MiB ('y' * n, then 'END' and a newline) on stdout in
1 MiB writes, then a short line; the other ranks print nothing."""
import os
import sys

if os.environ["RANK"] == "0":
    out = sys.stdout.buffer
    chunk = b"y" * (1 << 20)
    for _ in range(int(sys.argv[1])):
        out.write(chunk)
    out.write(b"END\nafter the long line\n")
    out.flush()
