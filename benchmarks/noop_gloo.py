"""A worker that only joins a gloo process group, passes a barrier and leaves (the floor's unit).

It appends "<start> <ready> <end>" wall times to argv[1] (when given; ready: torch imported,
the script's first line after its imports; with ``--ready-only`` after it, it leaves right
there, without a process group: the cold-start reference, one plain ``python`` process
importing torch), so the benchmark can split
what a launcher adds before the first worker starts and after the last one ends from what
torch itself takes, and leaves with os._exit: torch's interpreter finalization (0.3-1 s on a
busy machine, the same under every launcher) would only add noise.
"""
import os
import sys
import time

started = time.time()
import torch.distributed as dist  # noqa: E402

ready = time.time()

if sys.argv[2:] == ["--ready-only"]:
    with open(sys.argv[1], "a") as f:
        f.write(f"{started!r} {ready!r} {ready!r}\n")
    os._exit(0)
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
if len(sys.argv) > 1:
    with open(sys.argv[1], "a") as f:
        f.write(f"{started!r} {ready!r} {time.time()!r}\n")
sys.stdout.flush()
os._exit(0)
