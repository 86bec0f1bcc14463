"""No silent wrong placement: Kubeflow pods, elastic pods, a batch script without srun, OpenPAI
without a count, and hostile values in every cluster variable an environment reads.

Most cases are plain dicts (environments read the mapping they are given); a few go through the
real CLI with a crafted environment to prove the one-line error, exit 2, nothing created.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from clusterddp.envs import Overrides, detect
from clusterddp.envs.slurm import SlurmEnv
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.launch.start.workerenv import WorkerEnv
from clusterddp.spec import JobSpec
from clusterddp.topology import derive_port, resolve
from clusterddp.validate import MAX_NODES, as_token
from tests.conftest import cli, cli_env, write_job

#: A Kubeflow PyTorchJob v1 pod before PET_* existed (training-operator < #1840): worker 1 of 3 pods.
KUBEFLOW_V1 = {"MASTER_ADDR": "mnist-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
#: A worker-only elastic pod (elasticPolicy with min/max, no Master replica): only PET_*.
ELASTIC = {"PET_NNODES": "1:4", "PET_RDZV_ENDPOINT": "mnist-worker-0:23456", "PET_RDZV_BACKEND": "c10d",
           "PET_MAX_RESTARTS": "3", "PYTHONUNBUFFERED": "1"}
#: The batch script of a 2-node SLURM job (outside any step).
BATCH = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2"}
#: The seed recipe's OpenPAI variables, plus every task's IP as the runtime exports them.
PAI_SEED = {"PAI_TASK_INDEX": "1", "PAI_worker_0_SynPort_PORT": "23456",
            "PAI_HOST_IP_worker_0": "10.0.0.1", "PAI_HOST_IP_worker_1": "10.0.0.2", "PAI_HOST_IP_worker_2": "10.0.0.3"}
STEP = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
TORCHRUN = {"MASTER_ADDR": "h0", "MASTER_PORT": "29500", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
OPENPAI = {"PAI_TASK_INDEX": "1", "PAI_TASK_ROLE_TASK_COUNT_worker": "2", "PAI_HOST_IP_worker_0": "10.0.0.1",
           "PAI_HOST_IP_worker_1": "10.0.0.2", "PAI_worker_0_SynPort_PORT": "23456", "PAI_JOB_NAME": "alice~ddp"}
MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "n0"}
#: A TrainJob pod (torch-distributed runtime): node 1 of 2, as the torch plugin places it.
TRAINJOB = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "h0", "JOB_COMPLETION_INDEX": "1"}


def one_line_error(result) -> str:  # type: ignore[no-untyped-def]
    """The CLI refused in exactly one line, exit 2, without a traceback; returns the line."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterddp: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


# --- 1. Kubeflow PyTorchJob v1 pods without PET_*

@pytest.mark.parametrize("rank", [0, 1, 2])
def test_kubeflow_v1_pods_are_placed_one_launcher_per_pod(rank: int) -> None:
    """Each v1 pod is one node: node rank = RANK, nodes = WORLD_SIZE, master and port as given, with a note."""
    placement = detect({**KUBEFLOW_V1, "RANK": str(rank), "KUBERNETES_SERVICE_HOST": "10.96.0.1"}).placement()
    assert (placement.env, placement.nnodes, placement.node_rank) == ("kubeflow", 3, rank)
    assert (placement.master_addr, placement.master_port) == ("mnist-master-0", 23456)
    assert any("node rank = RANK" in note for note in placement.notes)


def test_kubeflow_v1_pod_through_the_cli() -> None:
    """The issue's reproduction: `clusterddp env --json` in a v1 pod says kubeflow, node 2 of 3."""
    import json

    result = cli("env", "--json", env=cli_env(**KUBEFLOW_V1))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["env"], data["nnodes"], data["node_rank"]) == ("kubeflow", 3, 2)
    assert (data["master_addr"], data["master_port"]) == ("mnist-master-0", 23456)
    assert any("WORLD_SIZE" in note for note in data["notes"])


def test_a_worker_calling_clusterddp_again_keeps_its_placement() -> None:
    """A clusterddp worker's own env (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK...), even in an elastic
    Kubeflow pod, is placed by its agent's GROUP_RANK/GROUP_WORLD_SIZE as before, never as a pod."""
    job = JobSpec(name="j", script="t.py", nproc_per_node=2)
    outer = resolve(job, detect({}, Overrides(nnodes=3, node_rank=1, master_addr="10.0.0.5",
                                              master_port=29500)).placement(), {})
    worker = {**KUBEFLOW_V1, **ELASTIC, **WorkerEnv(outer, 1).build(0)}
    placement = detect(worker).placement()
    assert (placement.env, placement.nnodes, placement.node_rank) == ("torchrun", 3, 1)
    assert (placement.master_addr, placement.master_port, placement.nproc_per_node) == ("10.0.0.5", 29500, 2)


def test_legacy_launch_worker_is_not_a_pod() -> None:
    """torch.distributed.launch's worker (RANK, WORLD_SIZE, LOCAL_RANK, no GROUP_RANK) stays local, as before."""
    assert detect({**KUBEFLOW_V1, "LOCAL_RANK": "0"}).name == "local"


def test_other_schedulers_keep_their_placement_despite_rank_variables() -> None:
    """A SLURM/MPI/OpenPAI script that exports RANK and WORLD_SIZE (a process count) is placed by its scheduler."""
    assert detect({**STEP, **KUBEFLOW_V1, "WORLD_SIZE": "8"}).name == "slurm"
    assert detect({**MPI, **KUBEFLOW_V1}).name == "mpi"
    assert detect({**OPENPAI, **KUBEFLOW_V1}).name == "openpai"


def test_kubeflow_after_pr_1840_is_placed_by_pet_variables() -> None:
    """A newer operator's pod (PET_NODE_RANK, PET_NNODES, WORLD_SIZE = pods x nproc) uses PET_NNODES, not WORLD_SIZE."""
    env = {**KUBEFLOW_V1, "WORLD_SIZE": "24", "PET_MASTER_ADDR": "mnist-master-0", "PET_MASTER_PORT": "23456",
           "PET_NODE_RANK": "2", "PET_NNODES": "3", "PET_NPROC_PER_NODE": "8"}
    placement = detect(env).placement()
    assert (placement.env, placement.nnodes, placement.node_rank, placement.nproc_per_node) == ("torchrun", 3, 2, 8)


def test_kubeflow_rank_outside_world_size_is_refused() -> None:
    """RANK >= WORLD_SIZE names RANK instead of training in a world that does not exist."""
    with pytest.raises(EnvironmentDetectionError, match=r"kubeflow: RANK: pod rank 3 is outside 0\.\.2"):
        detect({**KUBEFLOW_V1, "RANK": "3"}).placement()


# --- 2. Elastic pods

ELASTIC_CASES = [
    ("worker-only pod", ELASTIC, ["PET_NNODES='1:4'", "PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND='c10d'"]),
    ("endpoint alone", {"PET_RDZV_ENDPOINT": "w-0:29400"}, ["PET_RDZV_ENDPOINT"]),
    ("node range alone", {"PET_NNODES": "2:8"}, ["PET_NNODES='2:8'"]),
    ("master pod with elasticPolicy",
     {**KUBEFLOW_V1, "PET_MASTER_ADDR": "mnist-master-0", "PET_NODE_RANK": "2", **ELASTIC}, ["PET_RDZV_ENDPOINT"]),
    ("stale NODE_RANK with a c10d backend", {"MASTER_ADDR": "h", "NODE_RANK": "0", "NNODES": "2",
                                             "PET_RDZV_BACKEND": "c10d"}, ["PET_RDZV_BACKEND"]),
]


@pytest.mark.parametrize("case,env,names", ELASTIC_CASES, ids=[c[0] for c in ELASTIC_CASES])
def test_elastic_rendezvous_is_refused(case: str, env: dict[str, str], names: list[str]) -> None:
    """Rendezvous variables (no node rank given out yet) are refused, naming them: no rendezvous server."""
    with pytest.raises(EnvironmentDetectionError) as info:
        detect(env).placement()
    message = str(info.value)
    assert all(name in message for name in names), message
    assert "no rendezvous server" in message and "torchrun" in message and "\n" not in message


def test_elastic_pod_through_the_cli_starts_nothing(tmp_path: Path) -> None:
    """`clusterddp run` in an elastic pod: one line, exit 2, no logs/<run-id>/, no worker started."""
    canary = tmp_path / "started"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(canary)!r}, 'w').close()\n")
    job = write_job(tmp_path, script=str(script), nproc_per_node=1)
    line = one_line_error(cli("run", str(job), env=cli_env(**ELASTIC)))
    assert "PET_RDZV_ENDPOINT" in line and "no rendezvous server" in line
    assert not (tmp_path / "logs").exists() and not canary.exists()
    assert "no rendezvous server" in one_line_error(cli("env", env=cli_env(**ELASTIC)))


@pytest.mark.parametrize("env,nnodes", [
    ({"MASTER_ADDR": "m", "PET_NODE_RANK": "1", "PET_NNODES": "3:3"}, 3),
    ({"MASTER_ADDR": "m", "PET_NODE_RANK": "1", "PET_NNODES": "2", "PET_RDZV_BACKEND": "static"}, 2),
    ({"PET_NNODES": "1"}, 1),
])
def test_fixed_node_counts_are_placed(env: dict[str, str], nnodes: int) -> None:
    """A fixed count ('N', 'N:N', or the static backend) is a placement, not an elastic job."""
    assert detect(env).placement().nnodes == nnodes


def test_node_count_without_a_node_rank_is_refused() -> None:
    """PET_NNODES=2 without PET_NODE_RANK or a master: the pod's place is unknown, said in one line."""
    with pytest.raises(EnvironmentDetectionError, match="kubeflow: PET_NNODES: 2 nodes, but this pod has no node rank"):
        detect({"PET_NNODES": "2"}).placement()


# --- 3. A SLURM batch script without srun

def test_batch_script_without_srun_is_one_error() -> None:
    """Outside a step with no srun on PATH, relaunch names the cause instead of a FileNotFoundError."""
    with pytest.raises(EnvironmentDetectionError, match="srun is not on PATH"):
        SlurmEnv({**BATCH, "PATH": "/nonexistent"}, Overrides()).relaunch(["clusterddp", "run", "x.yaml"])


def test_batch_script_with_srun_on_path_relaunches(tmp_path: Path) -> None:
    """An executable srun in the mapping's PATH is found, and the relaunch is the srun command."""
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    command = SlurmEnv({**BATCH, "PATH": str(tmp_path)}, Overrides()).relaunch(["clusterddp", "run", "x.yaml"])
    assert command is not None and command[0] == "srun" and command[-2:] == ["run", "x.yaml"]


def test_batch_script_without_srun_through_the_cli(tmp_path: Path) -> None:
    """`clusterddp run` in a batch script whose PATH lacks srun: one line, exit 2, nothing created."""
    job = write_job(tmp_path, script="exit_with.py", nproc_per_node=1)
    env = cli_env(**BATCH)
    env["PATH"] = str(tmp_path / "empty-bin")
    line = one_line_error(cli("run", str(job), env=env))
    assert "srun is not on PATH" in line and "SLURM_JOB_ID" in line
    assert not (tmp_path / "logs").exists()


# --- 4. OpenPAI node count from the task IPs

def test_openpai_seed_variables_count_the_task_ips_through_the_cli() -> None:
    """The seed's variables, every task's IP, no job file: 3 nodes counted from the IPs, and a note says so."""
    import json

    result = cli("env", "--json", env=cli_env(**PAI_SEED))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["env"], data["nnodes"], data["node_rank"], data["master_addr"]) == ("openpai", 3, 1, "10.0.0.1")
    assert any("counted from the task IPs" in note for note in data["notes"])


# --- 5. Hostile values in every variable an environment reads

HUGE = "9" * 1_000_000
BAD_VALUES = [
    # (environment base, variable, value)
    *[(TORCHRUN, "GROUP_RANK", v) for v in (" 1", "1\n", "-1", "+1", "1_0", "\u0661", "0x1", "1.0", "10" * 13, HUGE)],
    (TORCHRUN, "GROUP_WORLD_SIZE", "0"), (TORCHRUN, "GROUP_WORLD_SIZE", str(10**26)),
    (TORCHRUN, "GROUP_WORLD_SIZE", str(MAX_NODES + 1)),
    *[(TORCHRUN, "MASTER_ADDR", v) for v in ("h 0", "h0\n", "-oProxyCommand=x", "a" * 300, "h\x00", "h;rm -rf /",
                                             "$(id)", "[::1]", "\u2028h", "h\x1b[2J", HUGE)],
    *[(TORCHRUN, "MASTER_PORT", v) for v in ("0", "65536", "99999", "-1", " 29500", "29500\n", "http")],
    (TORCHRUN, "TORCHELASTIC_RUN_ID", "run\nid"), (TORCHRUN, "TORCHELASTIC_RUN_ID", "x" * 5000),
    (TORCHRUN, "LOCAL_WORLD_SIZE", "\u00b2"), (TORCHRUN, "LOCAL_WORLD_SIZE", "100000"),
    (TORCHRUN, "LOCAL_WORLD_SIZE", "0"), (TRAINJOB, "PET_NPROC_PER_NODE", "0"),
    (TRAINJOB, "PET_NPROC_PER_NODE", "257"), (TRAINJOB, "PET_NPROC_PER_NODE", "-1"),
    (KUBEFLOW_V1, "RANK", "-1"), (KUBEFLOW_V1, "RANK", "2 "), (KUBEFLOW_V1, "WORLD_SIZE", str(10**26)),
    (KUBEFLOW_V1, "WORLD_SIZE", "0"), (KUBEFLOW_V1, "MASTER_ADDR", "mnist-master-0\nx"),
    (KUBEFLOW_V1, "MASTER_PORT", "0"),
    (STEP, "SLURM_NODEID", " 1"), (STEP, "SLURM_STEP_NUM_NODES", "-2"), (STEP, "SLURM_JOB_ID", "4\n2"),
    (STEP, "SLURM_STEP_NODELIST", "n[0-65535],m[0-65535]"), (STEP, "SLURM_STEP_NODELIST", "n[1-2]\x1b"),
    (STEP, "SLURM_STEP_NODELIST", "n[1-99999999]"), (STEP, "SLURM_STEP_NODELIST", "-x,n1"),
    (STEP, "SLURM_STEP_TASKS_PER_NODE", "1(x99999999999)"), (STEP, "SLURM_STEP_TASKS_PER_NODE", "1(x0)"),
    (STEP, "SLURM_GPUS_ON_NODE", "100000"), (STEP, "SLURM_RESTART_COUNT", "-1"), (STEP, "MASTER_PORT", "0"),
    (STEP, "MASTER_ADDR", "n1 n2"), (STEP, "SLURM_ARRAY_JOB_ID", "4\x00"),
    (OPENPAI, "PAI_TASK_INDEX", "1\n"), (OPENPAI, "PAI_TASK_ROLE_TASK_COUNT_worker", str(10**26)),
    (OPENPAI, "PAI_HOST_IP_worker_0", "10.0.0.1\nx"), (OPENPAI, "PAI_worker_0_SynPort_PORT", " 23456"),
    (OPENPAI, "PAI_worker_0_SynPort_PORT", "23456,\x1b[31m"), (OPENPAI, "PAI_RESOURCE_worker", "1e3,2"),
    (OPENPAI, "PAI_RESOURCE_worker", "100000,4,1,1"), (OPENPAI, "PAI_CURRENT_TASK_ROLE_NAME", "a\nb"),
    (OPENPAI, "CLUSTERDDP_OPENPAI_PORT_LABEL", "x y"), (OPENPAI, "FC_FRAMEWORK_ATTEMPT_ID", "1.0"),
    (OPENPAI, "PAI_JOB_NAME", "alice~ddp\n"), (OPENPAI, "PAI_JOB_NAME", "a" * 5000),
    (MPI, "OMPI_COMM_WORLD_RANK", "2"), (MPI, "OMPI_COMM_WORLD_SIZE", "0"), (MPI, "MASTER_ADDR", "n0\t"),
    (MPI, "MASTER_PORT", "65536"),
]


@pytest.mark.parametrize("base,name,value", BAD_VALUES,
                         ids=[f"{n}={v[:12]!r}" for _, n, v in BAD_VALUES])
def test_bad_cluster_values_are_one_bounded_line_naming_the_variable(base: dict[str, str], name: str,
                                                                     value: str) -> None:
    """Every bad value an environment reads is an EnvironmentDetectionError naming the variable, short and printable."""
    env = {**base, name: value}
    environment = detect(env)
    with pytest.raises(EnvironmentDetectionError) as info:
        environment.placement()
        environment.relaunch(["clusterddp", "run", "x.yaml"])
    message = str(info.value)
    assert name in message, message
    assert len(message) < 700 and message.isprintable(), repr(message[:300])


def test_bad_value_through_the_cli_is_one_line(tmp_path: Path) -> None:
    """A bad MASTER_PORT in a torchrun-placed node: one line naming it, exit 2, nothing created."""
    job = write_job(tmp_path, script="exit_with.py", nproc_per_node=1)
    line = one_line_error(cli("run", str(job), env=cli_env(**{**TORCHRUN, "MASTER_PORT": "99999"})))
    assert "MASTER_PORT" in line and "'99999'" in line
    assert not (tmp_path / "logs").exists()


def test_a_worker_count_of_0_is_refused_not_replaced(tmp_path: Path) -> None:
    """PET_NPROC_PER_NODE=0 in a TrainJob pod: one line naming it and the bounds 1-256, exit 2 (was: the job file's count)."""
    job = write_job(tmp_path, script="exit_with.py", nproc_per_node=2)
    line = one_line_error(cli("run", str(job), env=cli_env(**TRAINJOB, PET_NPROC_PER_NODE="0")))
    assert "PET_NPROC_PER_NODE: expected 1 to 256 workers per node, got 0" in line, line
    assert not (tmp_path / "logs").exists()


JOBSET_POD = {"JOB_COMPLETION_INDEX": "1", "CLUSTERDDP_JOBSET_NNODES": "2", "CLUSTERDDP_JOBSET_MASTER_ADDR": "h0"}


@pytest.mark.parametrize("missing", ["CLUSTERDDP_JOBSET_MASTER_ADDR", "CLUSTERDDP_JOBSET_NNODES"])
def test_a_jobset_pod_without_a_required_variable_is_refused(tmp_path: Path, missing: str) -> None:
    """A JobSet pod (index 1 of 2) lacking CLUSTERDDP_JOBSET_MASTER_ADDR or _NNODES: one line naming it, exit 2 (was: a one-node local job)."""
    variables = {k: v for k, v in JOBSET_POD.items() if k != missing}
    assert detect(variables).name == "jobset"
    job = write_job(tmp_path, script="exit_with.py", nproc_per_node=1)
    line = one_line_error(cli("run", str(job), env=cli_env(**variables)))
    assert f"jobset: {missing}: not set" in line, line
    assert not (tmp_path / "logs").exists()


def test_empty_variables_mean_unset() -> None:
    """`export MASTER_PORT=` (empty) is not given, as a shell user expects; nothing else is stripped."""
    placement = detect({**TORCHRUN, "MASTER_PORT": "", "TORCHELASTIC_RUN_ID": ""}).placement()
    assert placement.master_port is None and placement.run_id is None


@pytest.mark.parametrize("raw", ["alice~ddp", "../../etc", "a/b\\c", "..", "-rf", "\udcffjob", "x" * 300,
                                 "ünï cödé"])
def test_cluster_ids_become_safe_run_ids_alike_on_every_node(raw: str) -> None:
    """A cluster's id becomes a plain token (no '/', no leading '.' or '-', bounded), the same on every task."""
    runs = {detect({**OPENPAI, "PAI_JOB_NAME": raw, "PAI_TASK_INDEX": str(i)}).placement().run_id for i in (0, 1)}
    assert len(runs) == 1
    run_id = runs.pop()
    assert run_id == as_token(raw) and run_id is not None
    assert "/" not in run_id and run_id[0].isalnum() and len(run_id) <= 128 and os.path.basename(run_id) == run_id
    job = JobSpec(name="j", script="t.py", nproc_per_node=1)
    ports = {resolve(job, detect({**OPENPAI, "PAI_JOB_NAME": raw, "PAI_TASK_INDEX": str(i)}).placement(),
                     {}).master_port for i in (0, 1)}
    assert ports == {23456}
    assert derive_port(run_id) == derive_port(as_token(raw))


def test_composed_run_ids_stay_tokens() -> None:
    """A long job name plus the attempt, or a SLURM array id, still gives a run id the topology accepts."""
    env = {**OPENPAI, "PAI_JOB_NAME": "a~" + "b" * 500, "FC_FRAMEWORK_ATTEMPT_ID": "12"}
    job = JobSpec(name="j", script="t.py", nproc_per_node=1)
    run_id = resolve(job, detect(env).placement(), {}).run_id
    assert len(run_id) <= 128 and run_id == as_token("a~" + "b" * 500 + "-attempt12")
    step = {**STEP, "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "x/../2"}
    assert detect(step).placement().run_id == "40_x_.._2"


@pytest.mark.parametrize("addr", ["h\nx", "-oProxyCommand=x", "a b", "x" * 300])
def test_explicit_master_addr_is_a_host_name(addr: str) -> None:
    """--master-addr obeys the same host rule as MASTER_ADDR: one line naming the flag."""
    with pytest.raises(EnvironmentDetectionError, match="--master-addr: expected a host name"):
        detect({}, Overrides(nnodes=2, node_rank=0, master_addr=addr)).placement()
