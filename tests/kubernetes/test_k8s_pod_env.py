"""Inside a Kubernetes pod: a TrainJob pod (the torch plugin's PET_*), a JobSet pod (the renderer's
CLUSTERDDP_JOBSET_* and the Job's JOB_COMPLETION_INDEX) and a PyTorchJob pod each place the
launcher, and `clusterddp env` says which it is. Plain dicts, as the controllers fill a pod's env.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterddp.devices import cgroup_cpu_limit, cpu_count
from clusterddp.envs import Overrides, detect
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.launch.start.workerenv import WorkerEnv
from clusterddp.spec import JobSpec
from clusterddp.topology import resolve
from tests.conftest import REPO, cli, cli_env, write_job
from tests.kubernetes import pods
from tests.kubernetes.crds import require_crds


def trainjob_pod(name: str, num_nodes: int, index: int, nproc: str) -> dict[str, str]:
    """The env the torch plugin gives pod ``index`` of TrainJob ``name`` (torch.go EnforceMLPolicy):
    PET_NODE_RANK is a fieldRef to the completion index, which the Job controller also exports."""
    return {"PET_NNODES": str(num_nodes), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": "29500",
            "JOB_COMPLETION_INDEX": str(index), "KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def jobset_pod(name: str, nodes: int, index: int, **extra: str) -> dict[str, str]:
    """The env of pod ``index`` of a rendered JobSet: the renderer's contract plus the Job's index."""
    return {"CLUSTERDDP_JOBSET_MASTER_ADDR": f"{name}-node-0-0.{name}", "CLUSTERDDP_JOBSET_NNODES": str(nodes),
            "CLUSTERDDP_JOBSET_MASTER_PORT": "29500", "JOB_COMPLETION_INDEX": str(index), **extra}


#: A PyTorchJob pod of training-operator v1.9 (envvar.go): worker 1 is pod RANK 2 of 3, 4 procs each.
PYTORCHJOB_POD = {"MASTER_ADDR": "mnist-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "12", "RANK": "2",
                  "PET_MASTER_ADDR": "mnist-master-0", "PET_MASTER_PORT": "23456", "PET_NODE_RANK": "2",
                  "PET_NNODES": "3", "PET_NPROC_PER_NODE": "4", "PYTHONUNBUFFERED": "1"}
AUTO = JobSpec(name="j", script="t.py", nproc_per_node="auto")


@pytest.mark.parametrize("index", [0, 1, 2])
def test_trainjob_pod_is_named_and_placed_by_pet(index: int) -> None:
    """Each TrainJob pod is environment 'trainjob': node rank PET_NODE_RANK, nodes PET_NNODES, master and port."""
    placement = detect(trainjob_pod("mnist", 3, index, "4")).placement()
    assert (placement.env, placement.nnodes, placement.node_rank) == ("trainjob", 3, index)
    assert (placement.master_addr, placement.master_port) == ("mnist-node-0-0.mnist", 29500)
    assert placement.nproc_per_node == 4 and placement.nproc_word is None
    assert any(note.startswith("Kubeflow TrainJob pod") for note in placement.notes)


def test_trainjob_auto_is_one_worker_per_visible_gpu() -> None:
    """PET_NPROC_PER_NODE=auto (GPUs requested) on a pod with 3 visible GPUs runs 3 workers."""
    env = {**trainjob_pod("t", 2, 1, "auto"), "CUDA_VISIBLE_DEVICES": "0,1,2"}
    topology = resolve(AUTO, detect(env).placement(), env)
    assert (topology.env, topology.nproc_per_node, topology.world_size) == ("trainjob", 3, 6)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
@pytest.mark.parametrize("word", ["auto", "cpu"])
def test_trainjob_auto_without_gpu_is_the_pods_cpu_count(word: str) -> None:
    """PET_NPROC_PER_NODE auto (or cpu) without a visible GPU, in a launcher given one CPU: 1 worker, the CPU
    count torchrun would use (clusterddp's own auto would run 2)."""
    env = cli_env(**trainjob_pod("t", 2, 0, word), CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m", "clusterddp",
                             "env", "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["nproc_per_node"] == 1


def test_trainjob_gpu_word_without_gpu_names_the_pod() -> None:
    """PET_NPROC_PER_NODE=gpu on a pod without GPUs: one line naming the TrainJob, not the job file."""
    env = {**trainjob_pod("t", 2, 0, "gpu"), "CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(EnvironmentDetectionError, match=r"^trainjob: workers per node: 'gpu' but this node has no"):
        resolve(AUTO, detect(env).placement(), env)


def test_a_number_in_the_job_file_wins_over_the_word() -> None:
    """The job file's nproc_per_node: 2 wins over PET_NPROC_PER_NODE=auto, as it wins over any scheduler word."""
    env = {**trainjob_pod("t", 2, 0, "auto"), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    job = JobSpec(name="j", script="t.py", nproc_per_node=2, backend="gloo")
    assert resolve(job, detect(env).placement(), env).nproc_per_node == 2


def test_a_worker_in_a_trainjob_pod_is_placed_by_its_agent() -> None:
    """A worker inherits the pod's PET_*; its agent's GROUP_RANK places it (torchrun), never as a new pod."""
    pod = trainjob_pod("t", 2, 1, "2")
    topology = resolve(JobSpec(name="j", script="t.py", nproc_per_node=2), detect(pod).placement(), pod)
    worker = WorkerEnv(topology, 1).build(0)
    placement = detect({**pod, **worker}).placement()
    assert (placement.env, placement.node_rank, placement.nnodes) == ("torchrun", 1, 2)


def test_pytorchjob_pod_is_placed_as_before_and_says_so() -> None:
    """A PyTorchJob pod with PET_* is placed by PET_NODE_RANK/PET_NNODES as before, with a note naming it."""
    placement = detect(PYTORCHJOB_POD).placement()
    assert (placement.env, placement.nnodes, placement.node_rank, placement.nproc_per_node) == ("torchrun", 3, 2, 4)
    assert any(note.startswith("Kubeflow PyTorchJob pod") for note in placement.notes)
    v1 = {name: PYTORCHJOB_POD[name] for name in ("MASTER_ADDR", "MASTER_PORT", "RANK")} | {"WORLD_SIZE": "3"}
    assert any("PyTorchJob v1 pod" in note for note in detect(v1).placement().notes)


@pytest.mark.parametrize("index", [0, 3])
def test_jobset_pod_is_placed_by_the_renderers_contract(index: int) -> None:
    """A JobSet pod is env 'jobset': node rank JOB_COMPLETION_INDEX, nodes and master from CLUSTERDDP_JOBSET_*."""
    placement = detect(jobset_pod("cifar", 4, index)).placement()
    assert (placement.env, placement.nnodes, placement.node_rank) == ("jobset", 4, index)
    assert (placement.master_addr, placement.master_port) == ("cifar-node-0-0.cifar", 29500)
    assert placement.notes and placement.notes[0].startswith("JobSet pod: node rank = JOB_COMPLETION_INDEX")


@pytest.mark.parametrize("env,message", [
    ({"JOB_COMPLETION_INDEX": ""}, r"jobset: JOB_COMPLETION_INDEX: not set, but CLUSTERDDP_JOBSET_MASTER_ADDR is"),
    ({"JOB_COMPLETION_INDEX": "4"}, r"jobset: JOB_COMPLETION_INDEX: node rank 4 is outside 0\.\.3"),
    ({"CLUSTERDDP_JOBSET_NNODES": "0"}, r"jobset: CLUSTERDDP_JOBSET_NNODES: "),
    ({"CLUSTERDDP_JOBSET_MASTER_ADDR": "a b"}, r"jobset: CLUSTERDDP_JOBSET_MASTER_ADDR: "),
    ({"CLUSTERDDP_JOBSET_MASTER_PORT": "70000"}, r"jobset: CLUSTERDDP_JOBSET_MASTER_PORT: "),
])
def test_jobset_pod_with_a_bad_variable_names_it(env: dict[str, str], message: str) -> None:
    """Each broken contract variable is one error naming it, never a silent wrong placement."""
    with pytest.raises(EnvironmentDetectionError, match=message):
        detect({**jobset_pod("cifar", 4, 1), **env}).placement()


def test_explicit_flags_still_win_in_a_pod() -> None:
    """--node-rank/--master-addr typed in a pod win over the pod's variables (explicit comes first)."""
    placement = detect(jobset_pod("c", 4, 3), Overrides(nnodes=2, node_rank=1, master_addr="10.0.0.1")).placement()
    assert (placement.env, placement.nnodes, placement.node_rank) == ("explicit", 2, 1)


@pytest.mark.parametrize("env,name", [
    (trainjob_pod("mnist", 2, 1, "1"), "trainjob"), (jobset_pod("cifar", 2, 1), "jobset"),
    (PYTORCHJOB_POD, "torchrun"),
])
def test_env_command_says_which_pod(env: dict[str, str], name: str) -> None:
    """`clusterddp env` in each kind of pod prints its environment and the note naming the pod."""
    result = cli("env", "--nproc-per-node", "1", env=cli_env(**env))
    assert result.returncode == 0, result.stderr
    assert f"environment: {name}\n" in result.stdout
    kind = {"trainjob": "Kubeflow TrainJob pod", "jobset": "JobSet pod", "torchrun": "Kubeflow PyTorchJob pod"}[name]
    assert f"note: {kind}" in result.stdout


def test_jobset_restart_attempt_reaches_the_workers(tmp_path: Path) -> None:
    """CLUSTERDDP_RESTART_COUNT (the renderer's fieldRef to the restart-attempt label) is the workers' restart count."""
    job = write_job(tmp_path, script="dump_env.py", nproc_per_node=1)
    env = cli_env(**jobset_pod("cifar", 2, 1, CLUSTERDDP_RESTART_COUNT="3"))
    result = cli("run", str(job), "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert "TORCHELASTIC_RESTART_COUNT=3" in result.stdout and "GROUP_RANK=1" in result.stdout
    assert "MASTER_ADDR=cifar-node-0-0.cifar" in result.stdout


def _cgroup(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "proc").write_text(proc)
    return str(tmp_path), str(tmp_path / "proc")


@pytest.mark.parametrize("proc,files,expected", [
    ("0::/\n", {"cpu.max": "250000 100000\n"}, 3),  # limits.cpu 2500m: rounded up, as the torch plugin does
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),
    ("0::/kubepods/pod1/c1\n", {"kubepods/cpu.max": "400000 100000\n", "kubepods/pod1/c1/cpu.max": "max 100000\n"}, 4),
    ("4:cpu,cpuacct:/docker/abc\n", {"cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
                                     "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 2),  # v1, host path not mounted
    ("4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
])
def test_cgroup_cpu_limit(tmp_path: Path, proc: str, files: dict[str, str], expected: int | None) -> None:
    """The pod's CPU count is its cgroup quota in whole CPUs (v2 cpu.max or v1 cfs), the tightest level; none: None."""
    root, proc_file = _cgroup(tmp_path, proc, files)
    assert cgroup_cpu_limit(root, proc_file) == expected
    allowed = len(os.sched_getaffinity(0))
    assert cpu_count(root, proc_file) == (min(allowed, expected) if expected else allowed)


def test_env_json_in_a_trainjob_pod() -> None:
    """`clusterddp env --json` in a TrainJob pod: env trainjob, node 1 of 2, master node 0's DNS name."""
    result = cli("env", "--json", "--nproc-per-node", "1", env=cli_env(**trainjob_pod("mnist", 2, 1, "1")))
    data = json.loads(result.stdout)
    assert (data["env"], data["nnodes"], data["node_rank"], data["master_addr"]) == ("trainjob", 2, 1,
                                                                                        "mnist-node-0-0.mnist")


def rendered_pods(flavor: str) -> list[pods.Pod]:
    """The pods a cluster makes of ``clusterddp render k8s jobs/cifar10.yaml --flavor FLAVOR`` (tests/kubernetes/pods.py)."""
    *configmaps, manifest = yaml.safe_load_all(cli("render", "k8s", "jobs/cifar10.yaml", "--flavor", flavor,
                                                   env=cli_env(PYTHONPATH=str(REPO))).stdout)
    volumes = {c["metadata"]["name"]: c for c in configmaps}  # the launcher's, before the object
    if flavor == "jobset":
        return pods.jobset_pods(manifest, restart_attempt=2, configmaps=volumes)
    runtime = yaml.safe_load((require_crds() / "torch_distributed.yaml").read_text(encoding="utf-8"))
    return pods.trainjob_pods(manifest, runtime, configmaps=volumes)


@pytest.mark.parametrize("flavor", ["jobset", "trainjob"])
def test_env_in_a_pod_of_the_rendered_manifest_names_its_flavor(flavor: str) -> None:
    """`clusterddp env` with the env a cluster gives the pod of the rendered cifar10 object says its flavor and place."""
    pod = rendered_pods(flavor)[0]
    result = cli("env", "--json", "jobs/cifar10.yaml", env=cli_env(**pod.env, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["env"], data["nnodes"], data["node_rank"]) == (flavor, 1, 0)
    assert (data["master_addr"], data["master_port"]) == ("cifar10-node-0-0.cifar10", 29500)
    if flavor == "jobset":
        assert pod.env["CLUSTERDDP_RESTART_COUNT"] == "2" and not any(k.startswith("PET_") for k in pod.env)
    else:
        assert pod.env["PET_NPROC_PER_NODE"] == "4" and data["nproc_per_node"] == 4  # cpu: 4, no GPU
