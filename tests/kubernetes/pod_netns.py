"""Kubernetes pods on one machine: each pod a network namespace with its own IP on a bridge, its
own hostname, and the names a cluster's DNS gives it in a hosts file the pod's processes read.

Layout: bridge ``cdk8sbr0`` at 10.81.0.1/24; pod slot K is netns ``cdk8sK`` with ``eth0`` at
10.81.0.K+1 (tests/testbed/namespaces.py). A pod is started as its container would be:
``nsenter --net`` into its slot, ``unshare --uts --mount`` for its own hostname and a bind-mounted
``/etc/hosts`` (plus a files-only ``nsswitch.conf``: no resolver outside the file), then the
container's command with the environment tests/kubernetes/pods.py computed from the manifest.
A pod's ConfigMap volume (the launcher's zipapp and the job file) is written to a directory and
bind-mounted read-only at its ``mountPath`` in the pod's own mount namespace (an overlay over
the parent, /etc, so the mount point exists only there). The image's ``python3`` is a python
without clusterddp (IMAGE_PYTHON: the venv's base interpreter, with only the site-packages that
hold torch on PYTHONPATH, whose .pth files, the editable install's among them, are not read).
When a pod starts, its line (``IP <hostname>.<subdomain> <hostname>``) is appended to the shared
hosts file, as the headless service's record appears once the pod exists: a name resolves only
after its pod is up. Pods share the file system (the job's checkpoint directory is a shared
volume). One set at a time per machine: ``/run/cdk8s.lock``, leftovers removed first.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tests.conftest import REPO, cli_env
from tests.kubernetes.pods import Pod
from tests.testbed import namespaces
from tests.testbed.namespaces import NETNS_DIR, pids_in_netns

PREFIX = "cdk8s"
SUBNET = "10.81.0"
LOCK_FILE = f"/run/{PREFIX}.lock"
LEFTOVER_GRACE = 1.0
#: How a pod's container is started: own hostname, its ConfigMap files ($4) read-only at their
#: mountPath ($6, over a private overlay of its parent, scratch in $5), its emptyDir (a tmpfs)
#: at $7 (overlay scratch in $8), its working directory read-only when $9 is set (a bind mount:
#: root ignores permission bits, not a read-only mount), the test's hosts file and nsswitch.conf.
CONTAINER = ('over() { mount -t tmpfs tmpfs "$1" && mkdir "$1/u" "$1/w" && mount -t overlay overlay '
             '-o lowerdir="${2%/*}",upperdir="$1/u",workdir="$1/w" "${2%/*}" && mkdir -p "$2"; }; '
             'hostname "$1" || exit 1; if [ -n "$4" ]; then over "$5" "$6" '
             '&& mount --bind "$4" "$6" && mount -o remount,bind,ro "$6" || exit 1; fi; '
             'if [ -n "$7" ]; then over "$8" "$7" && mount -t tmpfs tmpfs "$7" || exit 1; fi; '
             'if [ -n "$9" ]; then mount --bind "$PWD" "$PWD" && mount -o remount,bind,ro "$PWD" && cd "$PWD" || exit 1; fi; '
             'mount --bind "$2" /etc/hosts && mount --bind "$3" /etc/nsswitch.conf && shift 9 && exec "$@"')
#: The image's python3: no clusterddp (checked by image_python_problem), torch from TORCH_SITE.
IMAGE_PYTHON = getattr(sys, "_base_executable", sys.executable)
_TORCH = importlib.util.find_spec("torch")
TORCH_SITE = os.path.dirname(os.path.dirname(str(_TORCH.origin))) if _TORCH else ""


def image_python_problem(cwd: Path) -> str | None:
    """Why IMAGE_PYTHON (with TORCH_SITE, in ``cwd``) is no image without clusterddp, or None."""
    done = subprocess.run([IMAGE_PYTHON, "-c", "import torch\ntry:\n import clusterddp\nexcept ImportError:\n"
                           " raise SystemExit(0)\nraise SystemExit(clusterddp.__file__)"], cwd=cwd, capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"], "PYTHONPATH": TORCH_SITE}, timeout=120)
    return None if done.returncode == 0 else f"{IMAGE_PYTHON} imports clusterddp or lacks torch: {done.stderr[-300:]}"


def unavailable_reason() -> str | None:
    return namespaces.unavailable_reason("needs root (network namespaces, mount namespaces)",
                                         ("ip", "nsenter", "unshare", "mount"))


@dataclass
class Running:
    """A started pod: its process (the container's PID 1 stand-in) and its output file."""

    pod: Pod
    slot: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class PodNetwork:
    """Slots for pods (namespace, IP) and the DNS they share."""

    slots: list[tuple[str, str]]
    root: Path
    hosts: Path = field(init=False)
    nsswitch: Path = field(init=False)

    def __post_init__(self) -> None:
        self.hosts = self.root / "hosts"
        self.hosts.write_text("127.0.0.1 localhost\n")
        self.nsswitch = self.root / "nsswitch.conf"
        self.nsswitch.write_text("hosts: files\n")

    def start(self, pod: Pod, slot: int, cwd: Path = REPO, read_only: bool = False) -> Running:
        """Run ``pod``'s container command in slot ``slot`` with the pod's env (in ``cwd``, read-only
        with ``read_only``, as an image's root-owned WORKDIR or readOnlyRootFilesystem); its DNS
        line appears now."""
        name, address = self.slots[slot]
        with self.hosts.open("a") as hosts:  # appended in place: the pods' bind mounts see it
            hosts.write(f"{address} {pod.fqdn} {pod.fqdn}.default.svc.cluster.local {pod.hostname}\n")
        argv, pythonpath = pod.argv, str(REPO)
        if argv[0] == "clusterddp":  # the image's console script (kubernetes.launcher: image): this checkout
            argv = [sys.executable, "-m", "clusterddp", *argv[1:]]
        elif argv[0] == "python3":  # the image's python: no clusterddp but the ConfigMap's zipapp
            argv, pythonpath = [IMAGE_PYTHON, *argv[1:]], TORCH_SITE
        log = self.root / f"{pod.name}.log"
        command = ["nsenter", f"--net={NETNS_DIR}/{name}", "unshare", "--uts", "--mount", "sh", "-c", CONTAINER,
                   pod.name, pod.hostname, str(self.hosts), str(self.nsswitch), *self.volume(pod),
                   *self.empty_dir(pod), "ro" if read_only else "", *argv]
        env = cli_env(**pod.env, PYTHONPATH=pythonpath)
        with log.open("wb") as out:
            proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT)
        return Running(pod, name, proc, log, time.monotonic())

    def volume(self, pod: Pod) -> list[str]:
        """The pod's one ConfigMap volume written to files: (directory, scratch, mountPath), or blanks."""
        if not pod.files:
            return ["", "", ""]
        ((mount_path, files),) = pod.files.items()
        assert mount_path.count("/") >= 2, "the overlay goes on the mount path's parent, which must not be /"
        directory, scratch = self.root / f"{pod.name}.configmap", self.root / f"{pod.name}.scratch"
        directory.mkdir()
        scratch.mkdir()
        for file_name, data in files.items():
            (directory / file_name).write_bytes(data)
        return [str(directory), str(scratch), mount_path]

    def empty_dir(self, pod: Pod) -> list[str]:
        """The pod's one emptyDir volume: (mountPath, overlay scratch), or blanks."""
        if not pod.empty_dirs:
            return ["", ""]
        (mount_path,) = pod.empty_dirs
        assert mount_path.count("/") >= 2, "the overlay goes on the mount path's parent, which must not be /"
        scratch = self.root / f"{pod.name}.emptydir"
        scratch.mkdir()
        return [mount_path, str(scratch)]

    def delete(self, running: Running, grace: float) -> None:
        """Delete the pod as the kubelet does: SIGTERM to the container's main process, SIGKILL to
        everything in it after ``grace`` s (terminationGracePeriodSeconds). Its exit code stays readable."""
        running.proc.send_signal(signal.SIGTERM)
        try:
            running.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill(running)
        namespaces.terminate(self.pids(running.slot), grace=0)

    def kill(self, running: Running) -> None:
        """The pod fails at once (its node lost, OOM-killed): SIGKILL to everything in it."""
        for pid in self.pids(running.slot):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        running.proc.wait(timeout=10)  # reaped here, before terminate() could take its status
        namespaces.terminate(self.pids(running.slot), grace=0)

    def pids(self, slot: str) -> list[int]:
        return pids_in_netns(os.stat(f"{NETNS_DIR}/{slot}").st_ino)


@contextlib.contextmanager
def pod_network(count: int, root: Path) -> Iterator[PodNetwork]:
    """``count`` pod slots under the lock; everything in them is ended and removed on exit."""
    with namespaces.exclusive(LOCK_FILE, lambda: namespaces.remove_leftovers(PREFIX, LEFTOVER_GRACE)):
        yield PodNetwork(namespaces.build_network(PREFIX, SUBNET, count), root)


def wait_all(running: list[Running], timeout: float) -> list[int]:
    """Every pod's exit code; a pod still running after ``timeout`` s is killed and reported as None."""
    deadline = time.monotonic() + timeout
    codes = []
    for item in running:
        try:
            codes.append(item.proc.wait(timeout=max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            for pid in pids_in_netns(os.stat(f"{NETNS_DIR}/{item.slot}").st_ino):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            item.proc.wait(timeout=10)
            codes.append(-999)
    return codes


def run_job(network: PodNetwork, running: list[Running], backoff_limit: int, timeout: float,
            grace: float = 10.0) -> list[int]:
    """The Job controller of one Indexed Job: once more pods failed than ``backoffLimit`` allows,
    the Job fails and its controller deletes the pods still active (SIGTERM, then SIGKILL after
    ``grace``). Returns every pod's exit code (-999: still running at ``timeout``, killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(item.proc.poll() is None for item in running):
        failed = [item for item in running if item.proc.poll() not in (None, 0)]
        if len(failed) > backoff_limit:
            for item in running:
                if item.proc.poll() is None:
                    network.delete(item, grace)
            break
        time.sleep(0.05)
    return wait_all(running, max(deadline - time.monotonic(), 0.1))


def outputs(running: list[Running]) -> str:
    return "\n".join(f"--- {item.pod.name} ---\n{item.output()[-4000:]}" for item in running)

