"""Write what a script can see of its own process as JSON to argv[1]/rank<RANK>.<argv[2]>.json:
argv, __main__, sys.path, environment, signals, descriptors, cwd, umask, session, parent,
PDEATHSIG, CPUs, threads, modules, torch's thread count; then join gloo and all-reduce."""
import ctypes
import json
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

main = sys.modules["__main__"]
umask = os.umask(0)
os.umask(umask)
death = ctypes.c_int(0)
ctypes.CDLL(None).prctl(2, ctypes.byref(death), 0, 0, 0)  # PR_GET_PDEATHSIG
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
fds = {}
for fd in sorted(os.listdir("/proc/self/fd"), key=int):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue  # the listing's own descriptor
    fds[fd] = target.split(":")[0] if ":" in target else target
seen = {
    "argv": sys.argv, "orig_argv": getattr(sys, "orig_argv", None), "path": sys.path,
    "main": {k: repr(v) for k, v in vars(main).items() if k.startswith("__") and k != "__builtins__"},
    "main_names": sorted(k for k in vars(main) if not k.startswith("__")),
    "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask,
    "signals": {s.name: repr(signal.getsignal(s)) for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP)},
    "sig_status": {k: status[k].strip() for k in ("SigBlk", "SigIgn", "SigCgt")},
    "fds": fds, "session_leader": os.getsid(0) == os.getpid(), "group_leader": os.getpgrp() == os.getpid(),
    "ppid": os.getppid(), "pid": os.getpid(), "pdeathsig": death.value,
    "cpus": sorted(os.sched_getaffinity(0)), "threads": threading.active_count(),
    "modules": sorted(sys.modules), "torch_threads": torch.get_num_threads(),
    "stdout": [sys.stdout.line_buffering, getattr(sys.stdout, "write_through", None)],
    "flags": repr(sys.flags), "executable": sys.executable, "name": __name__, "file": __file__,
    "cmdline": open("/proc/self/cmdline").read().split("\0"), "hash": hash("clusterddp"),
}
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.{sys.argv[2]}.json"), "w") as f:
    json.dump(seen, f)
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
print(f"rank {dist.get_rank()} sum {value.item()}", flush=True)
dist.destroy_process_group()
