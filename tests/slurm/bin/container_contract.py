"""Report what a worker sees, as JSON in argv[1]/rank<RANK>.json: the torchrun variables, the
host, the interpreter, where clusterddp comes from, whether the image knows clusterddp on its
own (``python3 -m pip show clusterddp`` and ``import clusterddp`` without the zipapp on the
path), its /proc/self/cmdline (warm: the zygote's), and a gloo all_reduce over every rank.
Once torch is imported it writes the time to argv[1]/started-rank<RANK> (the test measures
submit to the first rank with torch imported: a warm worker starts with torch imported, a cold
one imports it first, so a stamp written before the import would compare unlike starts)."""
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist

with open(os.path.join(sys.argv[1], f"started-rank{os.environ['RANK']}"), "w") as f:
    f.write(repr(time.time()))

import clusterddp  # noqa: E402

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
         "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "PYTHONPATH")
bare_path = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if not p.endswith(".pyz"))
bare = {**os.environ, "PYTHONPATH": bare_path}
pip = subprocess.run([sys.executable, "-m", "pip", "show", "clusterddp"], env=bare, capture_output=True, text=True)
imported = subprocess.run([sys.executable, "-c", "import clusterddp"], env=bare, capture_output=True, text=True)
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
dist.destroy_process_group()
report = {"env": {n: os.environ.get(n) for n in NAMES}, "host": socket.gethostname(), "python": sys.version,
          "executable": sys.executable, "clusterddp": clusterddp.__file__, "torch": torch.__file__,
          "pip_show": [pip.returncode, pip.stdout + pip.stderr],
          "import_without_pyz": [imported.returncode, imported.stderr.strip().splitlines()[-1:]],
          "all_reduce": total.item(),
          "cmdline": [w.decode() for w in open("/proc/self/cmdline", "rb").read().split(b"\0")[:-1]]}
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(report, f)
