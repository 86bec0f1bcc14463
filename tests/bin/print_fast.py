"""Print argv[1] numbered lines as fast as possible, mixing stdout and stderr, long lines too."""
import os
import sys

n = int(sys.argv[1])
rank = os.environ["RANK"]
pad = "x" * 3000
for i in range(n):
    stream = sys.stderr if i % 10 == 0 else sys.stdout
    stream.write(f"r{rank} line {i} {pad if i % 100 == 0 else ''}\n")
