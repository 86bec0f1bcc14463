"""Benchmark worker: a gloo DDP loop (all_reduce, 20 ms per step). In attempt 0 rank 1 writes
the wall time to OUT/killed and SIGKILLs itself at step STEP (20); in a later attempt
rank 0 writes the wall time of its first completed step to OUT/resumed, and all ranks
leave after that step (os._exit, as noop_gloo.py: interpreter teardown is not measured).

    kill_at_step.py OUT [STEP] [--dying] [--dying-rank R] [--sigterm-flag]

``--dying``: in attempt 0 the last rank (``--dying-rank R``: rank R) writes "WALL_TIME
HOSTNAME" to OUT/dying at STEP and goes on; the benchmark then kills its whole host (restart_latency.py --ssh-dead-host).
``--sigterm-flag``: a SIGTERM handler that only sets a flag, checked at each step boundary
(exit 75), as clusterddp.train's preemption handler does; a rank blocked in a collective
whose peer is gone cannot run it, so its launcher SIGKILLs it after grace_period.
"""
import argparse
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("step", type=int, nargs="?", default=20)
parser.add_argument("--dying", action="store_true")
parser.add_argument("--dying-rank", type=int, default=-1)
parser.add_argument("--sigterm-flag", action="store_true")
args = parser.parse_args()
out, kill_at = args.out, args.step
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
terminated = False


def _on_sigterm(signum: int, frame: object) -> None:
    global terminated
    terminated = True


if args.sigterm_flag:
    signal.signal(signal.SIGTERM, _on_sigterm)
dist.init_process_group("gloo")
rank = dist.get_rank()
last = rank == (args.dying_rank if args.dying_rank >= 0 else dist.get_world_size() - 1)
step = 0
while True:
    if terminated:
        os._exit(75)
    if attempt == 0 and step == kill_at and args.dying and last:
        with open(os.path.join(out, "dying.tmp"), "w") as f:
            f.write(f"{time.time()!r} {socket.gethostname()}")
        os.replace(os.path.join(out, "dying.tmp"), os.path.join(out, "dying"))  # the poller reads it whole
    elif attempt == 0 and step == kill_at and not args.dying and rank == 1:
        with open(os.path.join(out, "killed"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    value = torch.ones(16)
    dist.all_reduce(value)
    if attempt > 0:
        if rank == 0:
            with open(os.path.join(out, "resumed"), "w") as f:
                f.write(repr(time.time()))
        sys.stdout.flush()
        os._exit(0)
    step += 1
    time.sleep(0.02)
