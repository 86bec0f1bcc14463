"""Real containers under the real SLURM test bed: jobs with a ``container:`` section, 2 nodes x 2 workers.

The image (tests/testbed/containers.py) is Debian's python3 with torch but without clusterddp
or PyYAML: the launcher reaches it as the zipapp ``clusterddp submit`` builds. Each scenario
runs for ``runtime: oci`` (SLURM 22.05's native support with Debian's runc, oci.conf beside
slurm.conf) and for ``runtime: pyxis`` (marked ``pyxis``; runs only where
``CLUSTERDDP_TEST_PYXIS`` names pyxis's spank plugin, which the test bed adds to
plugstack.conf, and enroot is installed: neither is packaged in Debian). One cluster and one
image build serve every test here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml

from tests.conftest import cli_env
from tests.testbed import containers, spank
from tests.testbed.slurm_cluster import SlurmCluster, SlurmNode, slurm_cluster
from tests.testbed.slurm_cluster import unavailable_reason as slurm_unavailable
from tests.slurm.test_slurm_cluster import CIFAR10, batch_log, cifar10_args, submit, wait_for_file
from tests.slurm.test_slurm_cluster import failspank  # noqa: F401 (a fixture: built once per module)

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(slurm_unavailable() is not None, reason=str(slurm_unavailable()))]

BIN = Path(__file__).parent / "bin"
TESTS_BIN = Path(__file__).parent.parent / "bin"
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
JOB_ENV = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
PYXIS_PLUGIN = os.environ.get("CLUSTERDDP_TEST_PYXIS", "")


def pyxis_unavailable() -> str | None:
    if not PYXIS_PLUGIN:
        return "pyxis is not in SLURM's plugin stack: set CLUSTERDDP_TEST_PYXIS to its spank_pyxis.so"
    if not os.path.isfile(PYXIS_PLUGIN):
        return f"CLUSTERDDP_TEST_PYXIS={PYXIS_PLUGIN}: no such file"
    for tool in ("enroot", "mksquashfs"):
        if shutil.which(tool) is None:
            return f"{tool} not found (pyxis runs enroot; the image is made a squashfs with mksquashfs)"
    return None


@dataclass
class Runtime:
    """One runtime's container section, and how to see what it left behind."""

    name: str
    section: dict[str, object]
    leftovers: Callable[[], list[str]] = field(default=lambda: [])


@pytest.fixture(scope="session")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> containers.OciBundle:
    """The Debian image as an OCI bundle, built once per test session."""
    reason = containers.unavailable_reason()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("oci-image")
    started = time.monotonic()
    try:
        tar = containers.build_rootfs(directory)
    except RuntimeError as exc:  # the Debian mirror unreachable, for one
        pytest.skip(f"cannot build the Debian image: {exc}")
    containers.make_bundle(directory / "bundle", tar, tmp_path_factory.getbasetemp())
    tar.unlink()
    return containers.OciBundle(directory / "bundle", time.monotonic() - started)


@pytest.fixture(scope="module")
def cluster(bundle: containers.OciBundle) -> Iterator[SlurmCluster]:
    """The 2-node test bed, with oci.conf (runc) and, when asked for, pyxis in plugstack.conf
    before slurmd starts (spank.pyxis_line: runtime_path=DIR use_squashfuse=1)."""
    def plugstack(root: Path) -> list[str]:
        return [spank.pyxis_line(PYXIS_PLUGIN, root)] if pyxis_unavailable() is None else []

    with slurm_cluster(2, base_env=cli_env(), plugstack=plugstack) as running:
        with containers.oci_conf(running.conf, running.root / "runc"):
            yield running


#: Decided at collection, so that without pyxis its tests skip in no time, before the image
#: is built and the cluster started (both took 4-5 minutes only to skip; issue 32).
PYXIS_SKIP = pytest.mark.skipif(pyxis_unavailable() is not None, reason=str(pyxis_unavailable()))


@pytest.fixture(scope="module", params=["oci", pytest.param("pyxis", marks=[pytest.mark.pyxis, PYXIS_SKIP])])
def runtime(request: pytest.FixtureRequest, cluster: SlurmCluster, bundle: containers.OciBundle) -> Runtime:
    """The ``container:`` section for each runtime (pyxis skipped with the reason, before
    this fixture and those it needs are set up)."""
    if request.param == "oci":
        runc_root = cluster.root / "runc"
        return Runtime("oci", {"runtime": "oci", "image": str(bundle.path)},
                       lambda: containers.runc_containers(runc_root))
    image = bundle.path.parent / "image.sqsh"
    if not image.exists():
        subprocess.run(["mksquashfs", str(bundle.path / "rootfs"), str(image), "-noappend", "-quiet"],
                       check=True, capture_output=True, timeout=300)
    mounts = [f"{containers.host_site_packages()}:{containers.HOST_SITE}:ro"]
    return Runtime("pyxis", {"runtime": "pyxis", "image": str(image), "mounts": mounts})


def write_job(directory: Path, name: str, script: Path, runtime: Runtime | None, args: list[str] | None = None,
              **extra: object) -> Path:
    """A 2 x 2 job whose script is copied into its directory (which the container sees)."""
    shutil.copy(script, directory / script.name)
    data: dict[str, object] = {"name": name, "script": str(directory / script.name), "args": args or [],
                               "nodes": 2, "nproc_per_node": 2, "grace_period": 2, "env": JOB_ENV, **extra}
    if runtime is None:
        data["python"] = sys.executable
    else:
        data["container"] = {**runtime.section, "workdir": str(directory)}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def assert_nothing_left(cluster: SlurmCluster, runtime: Runtime) -> None:
    """No process on either node (by network namespace) and no container the runtime knows."""
    assert cluster.wait_clean(15) == {}
    assert runtime.leftovers() == []


def run_contract(cluster: SlurmCluster, directory: Path, runtime: Runtime | None) -> tuple[dict[int, dict], float]:  # type: ignore[type-arg]
    """Run tests/slurm/bin/container_contract.py 2 x 2; each rank's report and the seconds from
    submit to the first rank with torch imported."""
    directory.mkdir()
    job = write_job(directory, "contract", BIN / "container_contract.py", runtime, [str(directory)])
    submitted = time.time()
    job_id = submit(cluster, job)
    info = cluster.wait_state(job_id, DONE, timeout=240)
    log = batch_log(job, job_id)
    assert info["JobState"] == "COMPLETED", log
    assert "warm start off" not in log, log
    reports = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in directory.glob("rank*.json")}
    first = min(float(p.read_text()) for p in directory.glob("started-rank*"))
    return reports, first - submitted


def test_torchrun_contract_in_an_image_without_clusterddp(cluster: SlurmCluster, runtime: Runtime,
                                                          tmp_path: Path) -> None:
    """Every rank of a 2 x 2 job in the image gets the torchrun contract, runs gloo across the
    nodes and imports clusterddp from the zipapp only (pip show: not installed); every rank is
    forked by its node's zygote, run from the zipapp (issue 32, item 8), as the same job's
    ranks without a container are by zygote.py: the two start-up figures printed compare like
    with like, each from submit to the first rank with torch imported (item 9)."""
    reports, in_container = run_contract(cluster, tmp_path / runtime.name, runtime)
    assert_nothing_left(cluster, runtime)
    assert sorted(reports) == [0, 1, 2, 3], reports
    for rank, report in reports.items():
        env = report["env"]
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2"
        assert (env["GROUP_RANK"], env["LOCAL_RANK"]) == (str(rank // 2), str(rank % 2)), env
        assert report["host"] == f"cdslurm{rank // 2 + 1}" and env["MASTER_ADDR"] == "cdslurm1", report
        assert env["MASTER_PORT"] and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert report["executable"] == "/usr/bin/python3" and report["python"].startswith("3.11"), report
        assert report["clusterddp"].startswith(str(tmp_path / runtime.name / ".clusterddp")), report
        assert ".pyz" in report["clusterddp"] and report["torch"].startswith(containers.LINKED_SITE), report
        assert report["pip_show"][0] == 1 and "not found: clusterddp" in report["pip_show"][1], report
        assert report["import_without_pyz"] == [1, ["ModuleNotFoundError: No module named 'clusterddp'"]], report
        assert report["all_reduce"] == 6.0
        assert report["cmdline"][1:3] == [report["clusterddp"].rsplit("/clusterddp/", 1)[0], "--clusterddp-zygote"]
    bare_reports, bare = run_contract(cluster, tmp_path / "bare", None)
    assert all(r["cmdline"][1].endswith("/clusterddp/launch/start/zygote.py") for r in bare_reports.values()), bare_reports
    print(f"{runtime.name}: submit to first rank with torch imported (both warm) {in_container:.1f}s in the "
          f"container, {bare:.1f}s for the same job without one")


def test_crash_on_node_two_stops_node_one(cluster: SlurmCluster, runtime: Runtime, tmp_path: Path) -> None:
    """Rank 3 exiting 3 in node 2's container: FAILED, the root cause named in the batch log,
    node 1's hanging ranks stopped, nothing left on either node."""
    job = write_job(tmp_path, "failing", BIN / "fail_on_last_node.py", runtime)
    job_id = submit(cluster, job)
    info = cluster.wait_state(job_id, DONE, timeout=240)
    log = batch_log(job, job_id)
    assert info["JobState"] == "FAILED", log
    assert re.search(r"root cause.*\n\s+host:\s+cdslurm2\n\s+rank:\s+3 ", log), log
    assert "exit code 3" in log
    assert_nothing_left(cluster, runtime)


def launcher_pid(cluster: SlurmCluster, node: SlurmNode, job: Path) -> int:
    """The launcher (``python3 PYZ run JOB``) on ``node``, not a fork of another one."""
    def words(pid: int) -> list[str]:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return []

    def is_launcher(pid: int) -> bool:
        argv = words(pid)
        return "run" in argv and str(job) in argv and any(w.endswith(".pyz") for w in argv)

    def parent(pid: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    found = [pid for pid in cluster.node_processes(node) if is_launcher(pid) and not is_launcher(parent(pid))]
    assert len(found) == 1, (found, [words(p) for p in cluster.node_processes(node)])
    return found[0]


def test_killed_launcher_restarts_in_the_allocation(cluster: SlurmCluster, runtime: Runtime, tmp_path: Path) -> None:
    """restarts: 1, node 2's containerized launcher killed -9 after jobs/cifar10.py's first
    checkpoint: one restart in the allocation, resumed from the checkpoint, COMPLETED, nothing left."""
    out = tmp_path / "out"
    job = write_job(tmp_path, "restart", CIFAR10, runtime, cifar10_args(out, 2, 256),
                    restarts=1)
    job_id = submit(cluster, job)
    checkpoint = out / "checkpoints" / "last.pt"
    wait_for_file(checkpoint, job, job_id, timeout=240)
    os.kill(launcher_pid(cluster, cluster.nodes[1], job), signal.SIGKILL)
    info = cluster.wait_state(job_id, DONE, timeout=300)
    log = batch_log(job, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", log
    assert len(re.findall(r"clusterddp: attempt 0 ended with exit status [1-9]\d*; left out: none; restart 1 of 1 "
                          r"in 1s on 2 node\(s\): cdslurm1,cdslurm2\n", log)) == 1, log
    assert re.search(rf"\] resumed from {re.escape(str(checkpoint.parent))}/ckpt-\d+\.pt at epoch \d+ step \d+\n", log), log
    assert "epoch 2/2: train loss" in log
    assert_nothing_left(cluster, runtime)


def test_preemption_checkpoints_requeues_and_resumes(cluster: SlurmCluster, runtime: Runtime,
                                                     tmp_path: Path) -> None:
    """USR1 to the batch shell during epoch 2: the containerized workers checkpoint and exit 75,
    the job is requeued, and its second run resumes in the containers and COMPLETES."""
    out = tmp_path / "out"
    job = write_job(tmp_path, "preempt", CIFAR10, runtime, cifar10_args(out, 2, 512))
    job_id = submit(cluster, job)
    checkpoint = out / "checkpoints" / "last.pt"
    wait_for_file(checkpoint, job, job_id, timeout=240)
    cluster.command("scancel", "--signal=USR1", "--batch", job_id)
    requeued = cluster.wait_state(job_id, ("PENDING", *DONE), timeout=120)
    assert requeued["JobState"] == "PENDING" and requeued["Restarts"] == "1", batch_log(job, job_id)
    info = cluster.wait_state(job_id, DONE, timeout=300)
    log = batch_log(job, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    assert re.search(r"clusterddp\.train: preempted by .*SIGUSR1 on rank \d.* at epoch 1 step \d+; "
                     rf"checkpoint {re.escape(str(checkpoint.parent))}/ckpt-\d+\.pt; exiting with code 75", log), log
    assert re.search(rf"requeueing job {job_id}\n", log), log
    assert re.search(rf"\] resumed from {re.escape(str(checkpoint.parent))}/ckpt-\d+\.pt at epoch 1 step \d+\n", log), log
    assert_nothing_left(cluster, runtime)


def test_a_container_step_that_never_launches_fails_the_job(cluster: SlurmCluster, runtime: Runtime,
                                                            failspank: Path, tmp_path: Path) -> None:
    """failspank stops every task of the container step from launching and srun exits 0: the attempt
    fails naming both nodes and srun's error, and the job ends FAILED with exit 1."""
    job = write_job(tmp_path, "nolaunch", BIN / "container_contract.py", runtime, [str(tmp_path)])
    with spank.plugin_added(cluster.conf, f"required {failspank}"):
        job_id = submit(cluster, job)
        info = cluster.wait_state(job_id, DONE, timeout=120)
    log = batch_log(job, job_id)
    print("".join(line + "\n" for line in log.splitlines() if line.startswith("clusterddp:")), end="")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", log
    assert re.search(r"clusterddp: attempt 0: the launcher never started on 2 of 2 node\(s\): cdslurm1,cdslurm2: "
                     r"failspank: refusing to start the task \(slurmd's log on cdslurm1\); "
                     r"srun exited 0; srun's last error: srun: error: task \d " + re.escape(spank.LAUNCH_FAILED), log), log
    assert not list(tmp_path.glob("rank*.json"))
    assert_nothing_left(cluster, runtime)
