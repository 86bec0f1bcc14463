"""SlurmEnv: per-node placement, per-task refusal and batch-script scope, from plain dicts."""

from __future__ import annotations

import pytest

from clusterddp.envs import Overrides, detect
from clusterddp.envs.slurm import SlurmEnv
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.launch.start.workerenv import WorkerEnv
from clusterddp.spec import JobSpec
from clusterddp.topology import derive_port, resolve

#: What one launcher task per node sees: node 1 of a 2-node step (observed on SLURM 22.05.8,
#: reference/slurm.md, with --ntasks-per-node=1).
PER_NODE = {
    "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n2",
}

#: The batch script of the same job: no step, SLURM_NODEID/PROCID are 0, job-level values.
BATCH = {
    "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
}


def env_with(base: dict[str, str], **changes: str | None) -> dict[str, str]:
    env = dict(base)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


PLACEMENTS = [
    # (case, env, nnodes, node_rank, master, hosts, run_id, nproc hint)
    ("per-node node 1 of 2", PER_NODE, 2, 1, "n1", ("n1", "n2"), "42", None),
    ("per-node node 0", env_with(PER_NODE, SLURM_NODEID="0", SLURM_PROCID="0"), 2, 0, "n1", ("n1", "n2"), "42", None),
    ("step narrower than the job: step vars win",
     env_with(PER_NODE, SLURM_JOB_NODELIST="gpu[01-04]", SLURM_JOB_NUM_NODES="4",
              SLURM_STEP_NODELIST="gpu[03-04]", SLURM_STEP_NUM_NODES="2", SLURM_NNODES="2", SLURM_NODEID="0"),
     2, 0, "gpu03", ("gpu03", "gpu04"), "42", None),
    ("no step nodelist: job nodelist", env_with(PER_NODE, SLURM_STEP_NODELIST=None), 2, 1, "n1", ("n1", "n2"), "42", None),
    ("nnodes from the list alone",
     env_with(PER_NODE, SLURM_STEP_NUM_NODES=None, SLURM_NNODES=None, SLURM_STEP_NODELIST="a,b,c",
              SLURM_STEP_TASKS_PER_NODE="1(x3)", SLURM_NODEID="2"), 3, 2, "a", ("a", "b", "c"), "42", None),
    ("user's MASTER_ADDR wins", env_with(PER_NODE, MASTER_ADDR="10.0.0.9"), 2, 1, "10.0.0.9", ("n1", "n2"), "42", None),
    ("GPUs on the node are the nproc hint", env_with(PER_NODE, SLURM_GPUS_ON_NODE="4"), 2, 1, "n1", ("n1", "n2"), "42", 4),
    ("array element has its own run id",
     env_with(PER_NODE, SLURM_ARRAY_JOB_ID="40", SLURM_ARRAY_TASK_ID="2"), 2, 1, "n1", ("n1", "n2"), "40_2", None),
    ("one node, uneven nodelist syntax",
     env_with(PER_NODE, SLURM_STEP_NODELIST="node0007", SLURM_STEP_NUM_NODES="1", SLURM_NNODES="1",
              SLURM_STEP_TASKS_PER_NODE="1", SLURM_STEP_NUM_TASKS="1", SLURM_NTASKS="1", SLURM_NODEID="0"),
     1, 0, "node0007", ("node0007",), "42", None),
    ("batch script: node 0 of the allocation", BATCH, 2, 0, "n1", ("n1", "n2"), "42", None),
    ("batch script of an uneven allocation",
     env_with(BATCH, SLURM_JOB_NODELIST="c[1-4]", SLURM_JOB_NUM_NODES="4", SLURM_NNODES="4",
              SLURM_TASKS_PER_NODE="2(x3),1"), 4, 0, "c1", ("c1", "c2", "c3", "c4"), "42", None),
]


@pytest.mark.parametrize("case,env,nnodes,node_rank,master,hosts,run_id,nproc",
                         PLACEMENTS, ids=[p[0] for p in PLACEMENTS])
def test_placement(case: str, env: dict[str, str], nnodes: int, node_rank: int, master: str,
                   hosts: tuple[str, ...], run_id: str, nproc: int | None) -> None:
    """Each SLURM env set gives the node count, rank, master, hosts and run id of its scope."""
    placement = SlurmEnv(env, Overrides()).placement()
    assert (placement.nnodes, placement.node_rank, placement.master_addr) == (nnodes, node_rank, master)
    assert placement.hosts == hosts
    assert placement.run_id == run_id
    assert placement.nproc_per_node == nproc
    assert placement.master_port is None


PER_TASK = [
    ("2 tasks per node", env_with(PER_NODE, SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_STEP_NUM_TASKS="4",
                                  SLURM_NTASKS="4"), "SLURM_STEP_TASKS_PER_NODE=2(x2)"),
    ("uneven 2(x3),1 on the 1-task node",
     env_with(PER_NODE, SLURM_STEP_NODELIST="c[1-4]", SLURM_STEP_NUM_NODES="4", SLURM_NNODES="4",
              SLURM_STEP_TASKS_PER_NODE="2(x3),1", SLURM_STEP_NUM_TASKS="7", SLURM_NODEID="3"),
     "SLURM_STEP_TASKS_PER_NODE=2(x3),1"),
    ("no layout, more tasks than nodes",
     env_with(PER_NODE, SLURM_STEP_TASKS_PER_NODE=None, SLURM_STEP_NUM_TASKS="8"), "SLURM_STEP_NUM_TASKS=8"),
    ("no layout, only the step's SLURM_NTASKS",
     env_with(PER_NODE, SLURM_STEP_TASKS_PER_NODE=None, SLURM_STEP_NUM_TASKS=None, SLURM_NTASKS="4"),
     "SLURM_NTASKS=4"),
]


@pytest.mark.parametrize("case,env,cause", PER_TASK, ids=[p[0] for p in PER_TASK])
def test_per_task_mode_is_refused(case: str, env: dict[str, str], cause: str) -> None:
    """Several tasks per node in the step is per-task mode: refused, naming the variable and init_distributed."""
    with pytest.raises(EnvironmentDetectionError) as info:
        SlurmEnv(env, Overrides()).placement()
    message = str(info.value)
    assert "per-task mode" in message and cause in message
    assert "clusterddp.train.init_distributed" in message and "SLURM_PROCID" in message


def test_job_level_layout_does_not_mean_per_task() -> None:
    """Inside a 1-task-per-node step, the allocation's '2(x2)' layout (batch scope) is ignored."""
    env = env_with(PER_NODE, SLURM_TASKS_PER_NODE="2(x2)", SLURM_NTASKS_PER_NODE="2")
    assert SlurmEnv(env, Overrides()).placement().nnodes == 2


BROKEN = [
    ("bad nodelist", env_with(PER_NODE, SLURM_STEP_NODELIST="n[2-1]"), "SLURM_STEP_NODELIST"),
    ("node id outside", env_with(PER_NODE, SLURM_NODEID="2"), "SLURM_NODEID: 2 is outside 0..1"),
    ("node id and name missing", env_with(PER_NODE, SLURM_NODEID=None, SLURMD_NODENAME="n9"),
     "no SLURM_NODEID, and this host's name 'n9' is not in SLURM_STEP_NODELIST"),
    ("node id not a number", env_with(PER_NODE, SLURM_NODEID="one"), "SLURM_NODEID: expected an integer"),
    ("list and count disagree", env_with(PER_NODE, SLURM_STEP_NUM_NODES="3"), "lists 2 hosts"),
    ("bad layout", env_with(PER_NODE, SLURM_STEP_TASKS_PER_NODE="1(x)"), "SLURM_STEP_TASKS_PER_NODE"),
]


@pytest.mark.parametrize("case,env,fragment", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_variables_are_named(case: str, env: dict[str, str], fragment: str) -> None:
    """A malformed or contradictory SLURM variable gives an error naming it."""
    with pytest.raises(EnvironmentDetectionError) as info:
        SlurmEnv(env, Overrides()).placement()
    assert fragment in str(info.value)


def test_batch_script_relaunches_with_srun() -> None:
    """In the batch script, 'clusterddp run' becomes one srun task per allocated node."""
    argv = ["/venv/bin/python", "-m", "clusterddp", "run", "jobs/hello.yaml"]
    command = SlurmEnv(env_with(BATCH, SLURM_CPUS_PER_TASK="8"), Overrides()).relaunch(argv)
    assert command == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                       "--cpus-per-task=8", *argv]


def test_relaunch_of_python_dash_m() -> None:
    """Under 'python -m clusterddp' (argv[0] is __main__.py) srun gets the interpreter and -m."""
    import sys

    command = SlurmEnv(BATCH, Overrides()).relaunch(["/src/clusterddp/__main__.py", "run", "x.yaml"])
    assert command is not None and command[-5:] == [sys.executable, "-m", "clusterddp", "run", "x.yaml"]


def test_relaunched_launchers_do_not_relaunch() -> None:
    """Inside the srun step (SLURM_STEP_ID set) relaunch is None, so the fan-out cannot loop."""
    assert SlurmEnv(PER_NODE, Overrides()).relaunch(["clusterddp", "run", "x.yaml"]) is None


def test_batch_placement_says_it_relaunches() -> None:
    """'clusterddp env' in the batch script explains that run will fan out with srun."""
    placement = SlurmEnv(BATCH, Overrides()).placement()
    assert any("relaunches itself" in note for note in placement.notes)


def test_requeued_job_is_noted() -> None:
    """A requeued job (SLURM_RESTART_COUNT > 0) is shown as such."""
    placement = SlurmEnv(env_with(PER_NODE, SLURM_RESTART_COUNT="1"), Overrides()).placement()
    assert "requeued job: SLURM_RESTART_COUNT=1" in placement.notes


DETECTION = [
    ("slurm step", PER_NODE, "slurm"),
    ("batch script", BATCH, "slurm"),
    ("nothing", {}, "local"),
    ("torchrun inside SLURM", env_with(PER_NODE, MASTER_ADDR="h", GROUP_RANK="0", GROUP_WORLD_SIZE="1"), "torchrun"),
]


@pytest.mark.parametrize("case,env,name", DETECTION, ids=[d[0] for d in DETECTION])
def test_detection_order(case: str, env: dict[str, str], name: str) -> None:
    """SLURM is detected from SLURM_JOB_ID, after torchrun-style variables and before local."""
    assert detect(env).name == name


def test_explicit_flags_beat_slurm() -> None:
    """CLI placement flags win inside an allocation."""
    assert detect(PER_NODE, Overrides(nnodes=1, node_rank=0)).name == "explicit"


def test_topology_derives_the_same_port_on_every_node() -> None:
    """Both nodes resolve the same master and a port derived from the job id; ranks follow SLURM_NODEID."""
    job = JobSpec(name="hello", script="hello.py", nproc_per_node=2)
    tops = [resolve(job, SlurmEnv(env_with(PER_NODE, SLURM_NODEID=str(n)), Overrides()).placement(),
                    {"CUDA_VISIBLE_DEVICES": ""}) for n in (0, 1)]
    assert {(t.master_addr, t.master_port) for t in tops} == {("n1", derive_port("42"))}
    assert [list(t.node_ranks()) for t in tops] == [[0, 1], [2, 3]]
    assert WorkerEnv(tops[1], 1).build(0)["RANK"] == "3" and WorkerEnv(tops[1], 1).build(0)["WORLD_SIZE"] == "4"


def test_master_port_from_the_environment_wins() -> None:
    """MASTER_PORT exported in the job script is used as is."""
    placement = SlurmEnv(env_with(PER_NODE, MASTER_PORT="29511"), Overrides()).placement()
    assert placement.master_port == 29511


#: What SLURM 22.05 writes into an OCI container: the step's variables, none of the task's.
OCI_STEP = env_with(PER_NODE, SLURM_NODEID=None, SLURM_PROCID=None, SLURM_LOCALID=None, SLURMD_NODENAME=None)


def test_oci_container_places_itself_by_node_name() -> None:
    """Without SLURM_NODEID, SLURMD_NODENAME's index in the step's node list is the node rank."""
    placement = SlurmEnv(env_with(OCI_STEP, SLURMD_NODENAME="n2"), Overrides()).placement()
    assert (placement.node_rank, placement.nnodes, placement.master_addr) == (1, 2, "n1")


def test_oci_container_places_itself_by_host_name() -> None:
    """With neither SLURM_NODEID nor SLURMD_NODENAME (a 22.05 OCI step), this host's own name
    (short form too) is found in the step's node list."""
    import socket

    name = socket.gethostname().split(".")[0]
    env = env_with(OCI_STEP, SLURM_STEP_NODELIST=f"other1,{name}", SLURM_STEP_NUM_NODES="2")
    assert SlurmEnv(env, Overrides()).placement().node_rank == 1
