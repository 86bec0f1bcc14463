"""Containers for the SLURM test bed: a Debian image as an OCI bundle, and oci.conf for runc.

Facts behind it: ../shared/testbeds/containers/README.md (runc works here, crun and podman do
not; SLURM 22.05 takes ``RunTimeRun`` only; one task per node; oci.conf is read beside
slurm.conf at each step launch).

The image is what a site would have: Debian's python3 (3.11) with torch, without clusterddp
or PyYAML. ``mmdebstrap --variant=minbase --include=python3 bookworm`` builds the root file
system from the Debian registry (about 30 s, once per test session). torch comes from this
test run's own site-packages, bound read-only at ``/opt/host-site-packages``: the image holds
a directory of links to each of its entries except clusterddp's (its package, dist-info and
the editable install's ``.pth``/finder) and PyYAML's, and a ``.pth`` in the image's
dist-packages that adds that directory to ``sys.path``. So ``import torch`` works in the
image, ``import clusterddp`` does not, and the launcher must come in as the zipapp.

The bundle's config.json keeps the node's network namespace and host name (no ``network``
and no ``uts`` namespace): gloo reaches the other node by name, and the launcher finds its
node rank from its host name (22.05 hands no SLURM_NODEID into the container). It binds the
lab's /etc/hosts and /etc/resolv.conf, and ``shared`` (the tests' temporary directory, which
holds every job directory) at its own path, read-write.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

#: The Debian suite the image is built from (python3 3.11, as this test run's torch needs).
SUITE = "bookworm"
#: Where this run's site-packages appears inside the container (read-only).
HOST_SITE = "/opt/host-site-packages"
#: The directory of links to HOST_SITE's entries, inside the image; a .pth puts it on sys.path.
LINKED_SITE = "/opt/torch-site"
#: Entries of site-packages that must not reach the image: the point is an image without them.
EXCLUDED_PREFIXES = ("clusterddp", "__editable__", "__editable___clusterddp", "yaml", "_yaml", "pyyaml")
#: What a SLURM step with --container runs (22.05: RunTimeRun only; %n node, %j job, %s step,
#: %t task, %b the step's bundle). The container's id names node, job and step, so two nodes'
#: containers never share one in the shared ``--root``.
OCI_CONF = """\
RunTimeQuery="runc --root={root} state %n.%j.%s.%t"
RunTimeKill="runc --root={root} kill -a %n.%j.%s.%t SIGTERM"
RunTimeDelete="runc --root={root} delete --force %n.%j.%s.%t"
RunTimeRun="runc --root={root} run %n.%j.%s.%t -b %b"
"""


@dataclass(frozen=True)
class OciBundle:
    """A bundle directory (config.json + rootfs/) and what it took to build it."""

    path: Path
    build_seconds: float


def unavailable_reason() -> str | None:
    """Why an OCI bundle cannot be built or run here (None when it can): tests skip with this."""
    if os.geteuid() != 0:
        return "needs root (mmdebstrap's root mode, runc)"
    for tool in ("mmdebstrap", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install --no-install-recommends runc mmdebstrap)"
    return None


def host_site_packages() -> Path:
    """The site-packages this interpreter imports torch from (its own purelib when torch is
    missing), with symlinks resolved (the bind source): a venv that reaches another one's
    packages through a ``.pth`` (a git worktree's) has no torch in its own purelib."""
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent.parent
    return Path(sysconfig.get_paths()["purelib"]).resolve()


def build_rootfs(directory: Path) -> Path:
    """``mmdebstrap`` a minimal Debian with python3 into ``directory/rootfs.tar``.

    Raises RuntimeError with mmdebstrap's last lines (the Debian mirror unreachable, for one):
    the session fixture turns it into a skip reason.
    """
    tar = directory / "rootfs.tar"
    result = subprocess.run(["mmdebstrap", "--variant=minbase", "--include=python3", "--quiet", SUITE, str(tar)],
                            capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0 or not tar.exists():
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"mmdebstrap {SUITE} failed ({result.returncode}): {tail}")
    return tar


def make_bundle(directory: Path, rootfs_tar: Path, shared: Path) -> Path:
    """Unpack ``rootfs_tar`` as ``directory/rootfs`` and write its config.json (module docstring)."""
    rootfs = directory / "rootfs"
    rootfs.mkdir(parents=True)
    with tarfile.open(rootfs_tar) as tar:
        # Device nodes cannot be made everywhere and the runtime mounts its own /dev.
        members = [m for m in tar.getmembers() if not (m.isdev() or m.name.lstrip("./").startswith("dev/"))]
        tar.extractall(rootfs, members=members, filter="tar")
    site = host_site_packages()
    linked = rootfs / LINKED_SITE.lstrip("/")
    linked.mkdir(parents=True)
    for entry in sorted(site.iterdir()):
        if entry.name.lower().startswith(EXCLUDED_PREFIXES) or entry.suffix == ".pth":
            continue
        (linked / entry.name).symlink_to(f"{HOST_SITE}/{entry.name}")
    dist_packages = rootfs / "usr/lib/python3/dist-packages"
    dist_packages.mkdir(parents=True, exist_ok=True)
    (dist_packages / "clusterddp-testbed-torch.pth").write_text(LINKED_SITE + "\n")
    (rootfs / HOST_SITE.lstrip("/")).mkdir(parents=True)
    subprocess.run(["runc", "spec"], cwd=directory, check=True, capture_output=True)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(edit_config(config, rootfs, site, shared), indent=2))
    return directory


def edit_config(config: dict, rootfs: Path, site: Path, shared: Path) -> dict:  # type: ignore[type-arg]
    """``runc spec``'s default, made a SLURM node's container (module docstring)."""
    process = config["process"]
    process["terminal"] = False  # no tty: SLURM wires the step's output
    process["args"] = ["python3"]  # SLURM puts the step's command here
    config["root"] = {"path": str(rootfs), "readonly": True}  # absolute: SLURM copies config.json per step
    config.pop("hostname", None)  # runc refuses a hostname without a uts namespace
    linux = config["linux"]
    linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] not in ("network", "uts")]

    def bind(source: str | Path, target: str | Path, *flags: str) -> dict:  # type: ignore[type-arg]
        return {"destination": str(target), "type": "bind", "source": str(source), "options": ["rbind", *flags]}

    config["mounts"] += [
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        bind("/etc/hosts", "/etc/hosts", "ro"),
        *([bind("/etc/resolv.conf", "/etc/resolv.conf", "ro")] if os.path.exists("/etc/resolv.conf") else []),
        bind(site, HOST_SITE, "ro"),
        bind(shared, shared, "rw"),
    ]
    (rootfs / str(shared).lstrip("/")).mkdir(parents=True, exist_ok=True)
    return config


@contextlib.contextmanager
def oci_conf(slurm_conf: Path, runc_root: Path) -> Iterator[Path]:
    """oci.conf beside ``slurm_conf`` for as long as the block runs (slurmd reads it per step).

    Removed on exit, so the cluster's other tests run bare steps as before.
    """
    runc_root.mkdir(parents=True, exist_ok=True)
    path = slurm_conf.parent / "oci.conf"
    path.write_text(OCI_CONF.format(root=runc_root))
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def runc_containers(runc_root: Path) -> list[str]:
    """The ids of containers ``runc --root`` still knows (empty: nothing left)."""
    result = subprocess.run(["runc", f"--root={runc_root}", "list", "-q"], capture_output=True, text=True,
                            check=False, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"runc list failed: {result.stderr.strip()}")
    return result.stdout.split()
