"""Rank arithmetic, env contract, port derivation and environment detection, with plain dicts."""

from __future__ import annotations

import pytest

from clusterddp.envs import Overrides, detect
from clusterddp.envs.base import Placement
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.launch.start.workerenv import WorkerEnv
from clusterddp.spec import JobSpec
from clusterddp.topology import PORT_BASE, PORT_SPAN, derive_port, resolve

TORCHRUN_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                  "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}


def _topology(nnodes: int, node_rank: int, nproc: int):  # type: ignore[no-untyped-def]
    placement = Placement(env="explicit", nnodes=nnodes, node_rank=node_rank, master_addr="10.0.0.1",
                          master_port=29500, run_id="r")
    return resolve(JobSpec(script="x.py", nproc_per_node=nproc), placement, {})


@pytest.mark.parametrize("nnodes,nproc", [(1, 1), (1, 4), (2, 2), (8, 8), (3, 5)])
def test_global_ranks_cover_the_world_once(nnodes: int, nproc: int) -> None:
    """global rank = node_rank * nproc + local_rank covers 0..world-1 exactly once."""
    ranks = [WorkerEnv(_topology(nnodes, n, nproc), l).build(0)["RANK"] for n in range(nnodes) for l in range(nproc)]
    assert sorted(int(r) for r in ranks) == list(range(nnodes * nproc))


def test_worker_env_has_exactly_torchruns_names() -> None:
    """A worker's env has torchrun's names plus NODE_RANK, CLUSTERDDP_BACKEND and the defaults, nothing missing."""
    env = WorkerEnv(_topology(2, 1, 4), 3, max_restarts=2, error_file="/tmp/e.json").build(1)
    assert TORCHRUN_NAMES <= set(env)
    assert set(env) - TORCHRUN_NAMES == {"NODE_RANK", "CLUSTERDDP_BACKEND", "OMP_NUM_THREADS", "PYTHONUNBUFFERED",
                                         "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
    assert env["RANK"] == "7" and env["GROUP_RANK"] == "1" and env["WORLD_SIZE"] == "8"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "1" and env["TORCHELASTIC_MAX_RESTARTS"] == "2"


def test_local_rank_outside_node_is_rejected() -> None:
    """Asking for a local rank the node does not have is a programming error, caught."""
    with pytest.raises(ValueError):
        WorkerEnv(_topology(1, 0, 2), 2).build(0)


def test_derived_port_is_deterministic_and_in_range() -> None:
    """Every node derives the same port from the run id; different ids spread out."""
    assert derive_port("job-42") == derive_port("job-42")
    ports = {derive_port(f"job-{i}") for i in range(200)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert len(ports) > 150


def test_multinode_without_port_derives_it() -> None:
    """Two nodes started by hand without a port agree on one, derived from the run id."""
    job = JobSpec(script="x.py", nproc_per_node=2, name="myjob")
    a = resolve(job, detect({}, Overrides(nnodes=2, node_rank=0, master_addr="10.0.0.1")).placement(), {})
    b = resolve(job, detect({}, Overrides(nnodes=2, node_rank=1, master_addr="10.0.0.1")).placement(), {})
    assert a.master_port == b.master_port == derive_port("myjob")


def test_detection_order_explicit_beats_torchrun() -> None:
    """CLI flags win over an outer launcher's variables."""
    env = {"MASTER_ADDR": "h0", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
    assert detect(env, Overrides()).name == "torchrun"
    assert detect(env, Overrides(nnodes=4, node_rank=3, master_addr="x")).name == "explicit"
    assert detect({}, Overrides()).name == "local"


def test_torchrun_like_environment() -> None:
    """Kubeflow-style PET_* variables give the node placement and master."""
    env = {"PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456", "PET_NODE_RANK": "2",
           "PET_NNODES": "4", "PET_NPROC_PER_NODE": "auto"}
    placement = detect(env).placement()
    assert (placement.nnodes, placement.node_rank, placement.master_addr, placement.master_port) == \
        (4, 2, "job-master-0", 23456)
    assert placement.nproc_per_node is None


def test_torchrun_without_node_count_is_an_error() -> None:
    """A node rank without a node count is named, not guessed."""
    with pytest.raises(EnvironmentDetectionError, match="GROUP_WORLD_SIZE"):
        detect({"MASTER_ADDR": "h", "NODE_RANK": "0"}).placement()


def test_explicit_node_rank_out_of_range() -> None:
    """--node-rank must be below --nnodes."""
    with pytest.raises(EnvironmentDetectionError, match="outside"):
        detect({}, Overrides(nnodes=2, node_rank=2, master_addr="x")).placement()


def test_multinode_without_master_is_an_error() -> None:
    """Several nodes and no master address anywhere: one clear error with a hint."""
    with pytest.raises(EnvironmentDetectionError, match="no master address"):
        resolve(JobSpec(script="x.py", nproc_per_node=1), detect({}, Overrides(nnodes=2, node_rank=0)).placement(), {})


@pytest.mark.parametrize("request_,env,expected", [
    (3, {}, 3),
    ("auto", {"CUDA_VISIBLE_DEVICES": "0,1,2"}, 3),
    ("gpu", {"CUDA_VISIBLE_DEVICES": "4,5"}, 2),
    ("auto", {"CUDA_VISIBLE_DEVICES": ""}, None),  # no GPU: CPU slots
])
def test_nproc_resolution(request_, env, expected) -> None:  # type: ignore[no-untyped-def]
    """nproc_per_node: a number, GPUs visible, or CPU slots when there is none."""
    from clusterddp.devices import cpu_count

    topo = resolve(JobSpec(script="x.py", nproc_per_node=request_), detect({}).placement(), env)
    assert topo.nproc_per_node == (expected or cpu_count())
    assert topo.backend == ("nccl" if env.get("CUDA_VISIBLE_DEVICES") else "gloo")


def test_gpu_request_without_gpu_is_an_error() -> None:
    """nproc_per_node: gpu on a machine without GPUs says so."""
    with pytest.raises(EnvironmentDetectionError, match="no visible GPU"):
        resolve(JobSpec(script="x.py", nproc_per_node="gpu"), detect({}).placement(), {"CUDA_VISIBLE_DEVICES": ""})


def test_mpi_one_launcher_per_node() -> None:
    """Open MPI with one launcher per node: MPI rank = node rank; MASTER_ADDR required."""
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
           "MASTER_ADDR": "n0"}
    placement = detect(env).placement()
    assert (placement.env, placement.nnodes, placement.node_rank, placement.master_addr) == ("mpi", 4, 1, "n0")
    with pytest.raises(EnvironmentDetectionError, match="MASTER_ADDR"):
        detect({"PMI_RANK": "0", "PMI_SIZE": "2"}).placement()
    with pytest.raises(EnvironmentDetectionError, match="one launcher per node"):
        detect(dict(env, OMPI_COMM_WORLD_LOCAL_SIZE="8")).placement()


def test_nnodes_flag_cross_checks_the_scheduler() -> None:
    """--nnodes alone does not take over detection; a disagreeing count is an error."""
    env = {"MASTER_ADDR": "h0", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2"}
    environment = detect(env, Overrides(nnodes=3))
    assert environment.name == "torchrun"
    with pytest.raises(EnvironmentDetectionError, match="--nnodes says 3"):
        resolve(JobSpec(script="x.py", nproc_per_node=1), environment.placement(), env, nnodes=3)


@pytest.mark.parametrize("layout", [(2, 1, 1), (1, 3), (4, 2, 2, 1, 5), (1,)])
def test_uneven_nodes_rank_by_prefix_sums(layout: tuple[int, ...]) -> None:
    """Every node's ranks follow the nodes before it (torch elastic's assignment); together the
    nodes cover 0..world-1 once, and each worker's env says its node's own LOCAL_WORLD_SIZE."""
    seen: list[int] = []
    for node_rank, workers in enumerate(layout):
        placement = Placement(env="explicit", nnodes=len(layout), node_rank=node_rank, master_addr="10.0.0.1",
                              master_port=29500)
        topo = resolve(JobSpec(nproc_per_node=workers), placement, {}, node_workers=layout)
        assert topo.world_size == sum(layout)
        assert topo.node_ranks().start == sum(layout[:node_rank])
        for local_rank in range(workers):
            env = WorkerEnv(topo, local_rank).build(0)
            seen.append(int(env["RANK"]))
            assert env["LOCAL_WORLD_SIZE"] == str(workers) and env["GROUP_RANK"] == str(node_rank)
            assert env["WORLD_SIZE"] == str(sum(layout)) and env["GROUP_WORLD_SIZE"] == str(len(layout))
    assert seen == list(range(sum(layout)))


def test_equal_layout_is_torchruns_formula() -> None:
    placement = Placement(env="explicit", nnodes=3, node_rank=2, master_addr="10.0.0.1", master_port=29500)
    topo = resolve(JobSpec(nproc_per_node=2), placement, {}, node_workers=(2, 2, 2))
    assert topo.node_workers == () and topo.global_rank(1) == 2 * 2 + 1 and topo.world_size == 6
