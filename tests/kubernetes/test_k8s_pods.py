"""Pods made of network namespaces (tests/kubernetes/pod_netns.py), each given exactly what a
cluster gives a pod of the rendered manifest: its environment is computed from the manifest
the way the JobSet, Job and TrainJob controllers and the kubelet do (tests/kubernetes/pods.py),
its DNS name resolves once the pod exists, and it runs the container's own command: the image's
python3 (one without clusterddp) runs the launcher's zipapp from the rendered ConfigMap, mounted
read-only where the manifest says, in a working directory without clusterddp.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import BIN, REPO, cli, cli_env, wait_for
from tests.kubernetes import pods
from tests.kubernetes.crds import require_crds
from tests.kubernetes.pod_netns import (image_python_problem, outputs, pod_network, run_job, unavailable_reason,
                                       wait_all)

pytestmark = [pytest.mark.slow, pytest.mark.netns,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]
TIMEOUT = 50
CIFAR10 = REPO / "jobs" / "cifar10.py"


def job_file(tmp_path: Path, name: str, script: Path, args: list[str], **fields: Any) -> Path:
    """A 2-node x 2-worker gloo job with a kubernetes: section, on the pods' shared file system."""
    data = {"name": name, "script": str(script), "args": args, "nodes": 2, "nproc_per_node": 2,
            "backend": "gloo", "grace_period": 3, "logs": {"dir": str(tmp_path / "logs")},
            "container": {"image": "clusterddp-test:latest"}, **fields}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def render(job: Path, flavor: str) -> dict[str, Any]:
    """``clusterddp render k8s JOB --flavor FLAVOR``, parsed: the object, its ConfigMaps under "configmaps"."""
    done = cli("render", "k8s", str(job), "--flavor", flavor, env=cli_env(PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    *configmaps, manifest = yaml.safe_load_all(done.stdout)
    assert [c["kind"] for c in configmaps] == ["ConfigMap"]
    return {**manifest, "configmaps": {c["metadata"]["name"]: c for c in configmaps}}


def pods_of(manifest: dict[str, Any], attempt: int = 0) -> list[pods.Pod]:
    if manifest["kind"] == "JobSet":
        return pods.jobset_pods(manifest, restart_attempt=attempt, configmaps=manifest["configmaps"])
    runtime = yaml.safe_load((require_crds() / "torch_distributed.yaml").read_text(encoding="utf-8"))
    return pods.trainjob_pods(manifest, runtime, restart_attempt=attempt, configmaps=manifest["configmaps"])


def workdir(tmp_path: Path) -> Path:
    """The image's working directory: no clusterddp in it, and the image's python has none either."""
    path = tmp_path / "workdir"
    path.mkdir()
    problem = image_python_problem(path)
    assert problem is None, problem
    return path


@pytest.mark.parametrize("flavor", ["jobset", "trainjob"])
def test_two_pods_two_workers_keep_the_torchrun_contract(tmp_path: Path, flavor: str) -> None:
    """2 pods x 2 gloo workers of the rendered object all-reduce to 6; every rank sees the torchrun
    contract, node rank = the pod's completion index, and node 0's DNS name as MASTER_ADDR; every
    worker imported clusterddp from the ConfigMap's zipapp, the only clusterddp in the pod, and was
    forked by its pod's warm interpreter, run from that zipapp."""
    out = tmp_path / "ranks"
    out.mkdir()
    manifest = render(job_file(tmp_path, "ddp", BIN / "env_allreduce.py", [str(out)]), flavor)
    cwd = workdir(tmp_path)
    with pod_network(2, tmp_path) as network:
        started = time.monotonic()
        running = [network.start(pod, pod.index, cwd) for pod in reversed(pods_of(manifest))]  # node 1 first
        wait_for(lambda: any(out.iterdir()), timeout=TIMEOUT)
        first_rank = time.monotonic() - started
        codes = wait_all(running, TIMEOUT)
    assert codes == [0, 0], outputs(running)
    assert "warm start off" not in outputs(running), outputs(running)
    ranks = {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(4)}
    for rank, seen in ranks.items():
        env, node = seen["env"], rank // 2
        assert seen["sum"] == 6.0 and seen["host"] == f"ddp-node-0-{node}"
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == \
            (str(rank), "4", str(rank % 2), "2")
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_RANK"]) == (str(node), "2", str(rank))
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("ddp-node-0-0.ddp", "29500")
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_RUN_ID"]
        assert seen["clusterddp"] == "/etc/clusterddp/clusterddp.pyz/clusterddp/__init__.py", seen["clusterddp"]
        # forked by the pod's zygote, run from the ConfigMap's zipapp (issue 32, item 8)
        assert seen["cmdline"][1:3] == ["/etc/clusterddp/clusterddp.pyz", "--clusterddp-zygote"], seen["cmdline"]
    assert len({seen["env"]["TORCHELASTIC_RUN_ID"] for seen in ranks.values()}) == 1
    print(f"{flavor}: pods started -> first rank running {first_rank:.1f} s")


@pytest.mark.parametrize("flavor", ["jobset", "trainjob"])
def test_a_read_only_working_directory_keeps_the_launcher_running(tmp_path: Path, flavor: str) -> None:
    """A job file without logs.dir, in pods whose working directory is read-only (a root-owned
    WORKDIR, readOnlyRootFilesystem): the launchers write their logs and run files in the
    rendered emptyDir, and the 2 x 2 gloo all-reduce completes."""
    out = tmp_path / "ranks"
    out.mkdir()
    data = {"name": "ro", "script": str(BIN / "env_allreduce.py"), "args": [str(out)], "nodes": 2,
            "nproc_per_node": 2, "backend": "gloo", "grace_period": 3, "container": {"image": "clusterddp-test:1"}}
    job = tmp_path / "ro.yaml"
    job.write_text(yaml.safe_dump(data, sort_keys=False))
    manifest = render(job, flavor)
    cwd = workdir(tmp_path)
    with pod_network(2, tmp_path) as network:
        running = [network.start(pod, pod.index, cwd, read_only=True) for pod in pods_of(manifest)]
        assert all(item.pod.empty_dirs == ["/var/log/clusterddp"] for item in running)
        codes = wait_all(running, TIMEOUT)
    text = outputs(running)
    assert codes == [0, 0], text
    assert sorted(p.name for p in out.iterdir()) == [f"rank{rank}.json" for rank in range(4)], text
    for rank in range(4):
        env = json.loads((out / f"rank{rank}.json").read_text())["env"]
        assert env["CLUSTERDDP_HEARTBEAT_FILE"].startswith("/var/log/clusterddp/"), env
    assert list(cwd.iterdir()) == []


def job_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    return spec


def test_a_crash_on_node_1_stops_node_0_and_names_the_rank(tmp_path: Path) -> None:
    """Rank 3 (node 1) exits 3: node 1's launcher reports rank 3 as the root cause and fails its
    pod; the Job (backoffLimit 0) fails and its controller deletes node 0's pod, which stops."""
    manifest = render(job_file(tmp_path, "crash", BIN / "exit_with.py", ["3", "3"]), "jobset")
    assert job_spec(manifest)["backoffLimit"] == 0 and manifest["spec"]["failurePolicy"]["maxRestarts"] == 0
    cwd = workdir(tmp_path)
    with pod_network(2, tmp_path) as network:
        running = [network.start(pod, pod.index, cwd) for pod in pods_of(manifest)]
        codes = run_job(network, running, job_spec(manifest)["backoffLimit"], TIMEOUT)
    text = outputs(running)
    assert codes == [143, 3], (codes, text)  # node 0: 128 + SIGTERM; node 1: the root cause's code
    node1 = running[1].output()
    assert re.search(r"root cause \(first observed failure\):\n\s+host:\s+crash-node-0-1\n\s+rank:\s+3 ", node1), text
    assert "exit:       exit code 3" in node1, text
    assert "job 'crash' stopped: the launcher received SIGTERM" in running[0].output(), text
    assert "Traceback" not in text


def test_a_jobset_restart_resumes_cifar10_from_its_checkpoint(tmp_path: Path) -> None:
    """restarts: 1 (maxRestarts 1): node 1's pod dies after the first checkpoint, the JobSet recreates
    every pod with restart-attempt 1, and jobs/cifar10.py resumes from its checkpoint and completes."""
    out = tmp_path / "run"
    args = ["--epochs", "2", "--width", "8", "--batch-size", "8", "--synthetic-train", "256",
            "--synthetic-test", "32", "--workers", "0", "--out-dir", str(out)]
    manifest = render(job_file(tmp_path, "resume", CIFAR10, args, restarts=1), "jobset")
    assert manifest["spec"]["failurePolicy"]["maxRestarts"] == 1
    checkpoint = out / "checkpoints" / "last.pt"
    cwd = workdir(tmp_path)
    with pod_network(2, tmp_path) as network:
        first = [network.start(pod, pod.index, cwd) for pod in pods_of(manifest, attempt=0)]
        assert wait_for(checkpoint.exists, timeout=TIMEOUT), outputs(first)
        network.kill(first[1])  # node 1's pod fails: its Job fails (backoffLimit 0), not a 65/75 exit
        network.delete(first[0], grace=10)  # the JobSet restarts: every Job deleted, then recreated
        second = [network.start(pod, pod.index, cwd) for pod in pods_of(manifest, attempt=1)]
        assert all(pod.pod.env["CLUSTERDDP_RESTART_COUNT"] == "1" for pod in second)
        codes = wait_all(second, TIMEOUT)
    text = outputs(second)
    assert codes == [0, 0], text
    assert re.search(rf"resumed from {re.escape(str(checkpoint.parent))}/ckpt-\d+\.pt at epoch \d+ step \d+", text), text
    print(text[-1500:])
