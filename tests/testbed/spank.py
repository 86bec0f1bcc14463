"""SPANK plugins in the SLURM test bed: ``plugstack.conf`` beside slurm.conf, and failspank.

Facts behind it (../shared/testbeds/slurm/README.md): srun and every slurmstepd read
plugstack.conf beside slurm.conf at each step launch, so a line added while the cluster runs
applies to the next step and its removal restores normal steps, without a restart; a plugin
that creates its runtime directory when slurmd starts (pyxis) must be listed before slurmd
starts instead (``slurm_cluster(plugstack=...)``).

``tests/slurm/spank/failspank.c`` fails every srun step's task launch on the compute node
(the batch step still runs), as a broken pyxis does: srun prints ``task N launch failed:
Plugin initialization failed`` and exits 0. It is built here with gcc against libslurm-dev's
headers.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

FAILSPANK_SOURCE = Path(__file__).resolve().parent.parent / "slurm" / "spank" / "failspank.c"
#: What the step's srun prints for each task the plugin stopped (SLURM 22.05).
LAUNCH_FAILED = "launch failed: Plugin initialization failed"
#: pyxis's runtime directory (its ``runtime_path``), made in the cluster's directory.
PYXIS_RUNTIME = "pyxis-run"


def build_unavailable() -> str | None:
    """Why failspank.so cannot be built here (None when it can): tests skip with this reason."""
    if shutil.which("gcc") is None:
        return "gcc not found (apt-get install --no-install-recommends gcc libslurm-dev)"
    probe = subprocess.run(["gcc", "-E", "-x", "c", "-"], input="#include <slurm/spank.h>\n",
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "slurm/spank.h not found (apt-get install --no-install-recommends libslurm-dev)"
    return None


def build_failspank(directory: Path) -> Path:
    """``gcc -shared -fPIC`` failspank.c into ``directory/failspank.so``."""
    target = directory / "failspank.so"
    result = subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(target), str(FAILSPANK_SOURCE)],
                            capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"gcc failed to build failspank.so: {result.stderr.strip()}")
    return target


def pyxis_line(plugin: str, cluster_root: Path) -> str:
    """pyxis's plugstack.conf line for the test bed (slurm_cluster writes it before slurmd starts).

    ``runtime_path``: a directory that exists (pyxis makes ``/run/pyxis`` only when slurmd
    starts with it listed, and the nodes share the machine's /run); ``use_squashfuse=1``: each
    step runs straight from the .sqsh, because the nodes share one file system and enroot's
    default data path collided between them (``File already exists`` on one node, ``No such
    file or directory`` on the other)."""
    runtime = cluster_root / PYXIS_RUNTIME
    runtime.mkdir(exist_ok=True)
    return f"required {plugin} runtime_path={runtime} use_squashfuse=1"


def plugstack_path(slurm_conf: Path) -> Path:
    """Where SLURM reads its SPANK plugin stack: beside slurm.conf."""
    return slurm_conf.parent / "plugstack.conf"


@contextlib.contextmanager
def plugin_added(slurm_conf: Path, line: str) -> Iterator[None]:
    """``line`` appended to plugstack.conf while the block runs; the file as it was afterwards."""
    path = plugstack_path(slurm_conf)
    before = path.read_text() if path.exists() else None
    path.write_text((before or "") + line + "\n")
    try:
        yield
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)
