"""A training loop that meets a transient fault after its first steps, then resumes from its checkpoint.

``transient_fault.py MODE DIR``: each rank runs STEPS steps (an all_reduce over gloo when MODE
needs a collective), calls ``heartbeat()`` and saves the next step to ``DIR/ckpt.rank<R>``.
A start reads that checkpoint and says where it resumed in ``DIR/start.rank<R>.attempt<A>``.
In attempt 0, after step 1 (progress made), MODE happens:

- ``sigkill``, ``sigterm``: rank ``FAULT_RANK`` writes its pid to ``DIR/fault.pid`` and waits;
  the test signals it from outside;
- ``link``: the same over gloo, and the test cuts the link of that rank's host (tests/ssh);
- ``oom``: the rank joins the memory cgroup ``DIR/memory-cgroup`` names (the test made it,
  with a small limit) and allocates until the kernel's OOM killer ends it; without that file
  it behaves as ``sigkill`` (the test sends the OOM killer's signal itself);
- ``timeout``: rank ``FAULT_RANK`` stops answering, so the other's all_reduce times out
  (the process group's timeout is 2 s).
"""
import datetime
import os
import sys
import time
from typing import Callable

from clusterddp.train import heartbeat

STEPS = 4
FAULT_RANK = int(os.environ["WORLD_SIZE"]) - 1
COLLECTIVE = {"sigkill", "timeout", "link"}


def main() -> None:
    mode, directory = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    checkpoint = os.path.join(directory, f"ckpt.rank{rank}")
    start = int(open(checkpoint).read()) if os.path.exists(checkpoint) else 0
    with open(os.path.join(directory, f"start.rank{rank}.attempt{attempt}"), "w") as f:
        f.write(str(start))
    all_reduce = _collective(mode, attempt)
    for step in range(start, STEPS):
        if attempt == 0 and step == 2:
            _fault(mode, rank, directory)
        all_reduce()
        heartbeat(step)
        with open(checkpoint + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(checkpoint + ".tmp", checkpoint)
        time.sleep(0.05)
    print(f"rank {rank} finished at step {STEPS} (attempt {attempt}, resumed at {start})", flush=True)


def _collective(mode: str, attempt: int) -> Callable[[], object]:
    """The step's all_reduce; only attempt 0 of ``timeout`` gets the 2 s timeout, and only for it.

    The rendezvous and the restarted attempt keep 60 s: on a loaded machine a rank can start
    seconds after its peer, and a 2 s init or a 2 s step in attempt 1 then fails a second time.
    """
    if mode not in COLLECTIVE:
        return lambda: None
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    group = None
    if mode == "timeout" and attempt == 0:
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=2))
    return lambda: dist.all_reduce(torch.ones(1), group=group)


def _fault(mode: str, rank: int, directory: str) -> None:
    if rank != FAULT_RANK:
        return
    cgroup_file = os.path.join(directory, "memory-cgroup")
    if mode == "oom" and os.path.exists(cgroup_file):
        with open(os.path.join(open(cgroup_file).read(), "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        hog = []
        while True:  # the limit is far below this: the kernel kills us on the way
            chunk = bytearray(16 << 20)
            for i in range(0, len(chunk), 4096):
                chunk[i] = 1
            hog.append(chunk)
    if mode == "timeout":
        time.sleep(60)  # in the peers' all_reduce, never joined: theirs time out
    with open(os.path.join(directory, "fault.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(directory, "fault.pid.tmp"), os.path.join(directory, "fault.pid"))
    time.sleep(60)


if __name__ == "__main__":
    main()
