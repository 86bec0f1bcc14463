"""The env-contract reader of clusterddp.train, with plain dicts (no torch, no processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from clusterddp.train.distenv import (DistEnvError, expand_tasks_per_node, local_rank_from_argv,
                                      read_dist_env, slurm_master_port)
from rankrun import REPO, clean_env

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
SLURM_STEP = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
              "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
              "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]",
              "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"}


def fake_expand(text: str) -> list[str]:
    assert text == "gpu[07-08]"
    return ["gpu07", "gpu08"]


@pytest.mark.parametrize("env, argv, expected", [
    ({}, [], (0, 1, 0, "single")),
    (TORCHRUN, [], (3, 4, 1, "torchrun")),
    ({**TORCHRUN, "LOCAL_RANK": "0"}, ["--local_rank=1"], (3, 4, 0, "torchrun")),
    ({k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}, ["--local_rank=1"],
     (3, 4, 1, "torch.distributed.launch")),
    ({k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}, ["--local-rank", "1"],
     (3, 4, 1, "torch.distributed.launch")),
    ({**SLURM_STEP, **TORCHRUN}, [], (3, 4, 1, "torchrun")),  # launcher inside SLURM wins
    (SLURM_STEP, [], (3, 4, 1, "slurm")),
    ({k: v for k, v in SLURM_STEP.items() if not k.startswith("SLURM_STEP")}, [],
     (0, 1, 0, "single")),  # the batch script itself is not a rank
    ({"RANK": "0", "WORLD_SIZE": "1"}, [], (0, 1, 0, "torchrun")),
])
def test_read_dist_env_table(env, argv, expected) -> None:
    """Each contract gives the right (rank, world size, local rank, source), in priority order."""
    got = read_dist_env(env, argv, expand_hostlist=fake_expand)
    assert (got.rank, got.world_size, got.local_rank, got.source) == expected


def test_slurm_master_is_first_host_and_port_is_derived_from_job_id() -> None:
    """SLURM per-task mode: master = first nodelist host, port 15000 + last 4 job-id digits."""
    got = read_dist_env(SLURM_STEP, expand_hostlist=fake_expand)
    assert (got.master_addr, got.master_port, got.local_world_size) == ("gpu07", 15000 + 3456, 2)
    preset = read_dist_env({**SLURM_STEP, "MASTER_ADDR": "h", "MASTER_PORT": "4000"},
                           expand_hostlist=fake_expand)
    assert (preset.master_addr, preset.master_port) == ("h", 4000)


@pytest.mark.parametrize("env, argv, message", [
    ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, [], "rank 4 is outside"),
    ({"RANK": "x", "WORLD_SIZE": "4"}, [], "RANK='x' is not an integer"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, [], "MASTER_ADDR and MASTER_PORT"),
    ({}, ["--local_rank=0"], "RANK and WORLD_SIZE are not set"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, [], "SLURM_NTASKS"),
])
def test_read_dist_env_rejects_broken_contracts(env, argv, message) -> None:
    """Incomplete or contradictory variables fail with a message naming the problem."""
    with pytest.raises(DistEnvError, match=message):
        read_dist_env(env, argv, expand_hostlist=fake_expand)


@pytest.mark.parametrize("text, expected", [
    ("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]), ("1,3", [1, 3]),
])
def test_expand_tasks_per_node(text, expected) -> None:
    """SLURM's compressed task counts expand per node."""
    assert expand_tasks_per_node(text) == expected


def test_local_rank_argv_forms() -> None:
    """All spellings torch.distributed.launch has used are read; other flags are ignored."""
    assert local_rank_from_argv(["--lr", "1", "--local_rank=2"]) == 2
    assert local_rank_from_argv(["--local-rank=5"]) == 5
    assert local_rank_from_argv(["--local_rank", "7", "x"]) == 7
    assert local_rank_from_argv(["--local_rankx=1"]) is None
    with pytest.raises(DistEnvError):
        local_rank_from_argv(["--local_rank"])


def test_slurm_port_without_job_id_is_the_fixed_default() -> None:
    """No job id and no MASTER_PORT: every task still picks the same port."""
    assert slurm_master_port({}) == 12910


def test_launcher_side_modules_do_not_import_torch() -> None:
    """exitcodes, liveness and distenv stay importable without torch (the launcher uses them)."""
    code = ("import sys, clusterddp.train, clusterddp.train.exitcodes, clusterddp.train.liveness, "
            "clusterddp.train.distenv; from clusterddp.train import PREEMPTED_EXIT_CODE, heartbeat; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


def test_preempted_exit_code_matches_the_launchers_copy() -> None:
    """clusterddp.exitcodes (launcher) and clusterddp.train.exitcodes agree on 75."""
    from clusterddp.train.exitcodes import PREEMPTED_EXIT_CODE

    launcher = pytest.importorskip("clusterddp.exitcodes", reason="launcher's exitcodes not present")
    assert PREEMPTED_EXIT_CODE == launcher.PREEMPTED == 75
