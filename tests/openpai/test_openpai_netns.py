"""Acceptance: two OpenPAI tasks in two network namespaces run the hello job as one gloo job.

Each "task" gets exactly the environment the OpenPAI runtime gives the user's commands
(pai_runtime.py) and runs the rendered spec's commands joined the way the REST server joins
them; the launchers find each other only through those variables.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from pai_netns import IFNAME, Node, pai_nodes, unavailable_reason
from pai_runtime import SEED_VARIABLES, TaskRole, runtime_env

from clusterddp.envs import Overrides
from clusterddp.schedulers.openpai.render import render_openpai
from clusterddp.sections.container import ContainerSpec
from clusterddp.sections.openpai import OpenPAISpec
from clusterddp.spec import load_job

REPO = Path(__file__).resolve().parent.parent.parent
HELLO = REPO / "jobs" / "hello.yaml"
TIMEOUT = 240
RANK_LINE = re.compile(r"hello from rank (\d+)/4 .*all_reduce sum 6 == 6")

pytestmark = [pytest.mark.slow, pytest.mark.netns,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]


def base_env() -> dict[str, str]:
    """This machine's environment without any placement variable, clusterddp's bin dir on PATH."""
    drop = ("PAI_", "FC_", "SLURM_", "PET_", "OMPI_", "CLUSTERDDP_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k not in (
        "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "NODE_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK",
        "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(OMP_NUM_THREADS="1", NO_COLOR="1")
    return env


def run_on(nodes: list[Node], argvs: list[list[str]], envs: list[dict[str, str]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Start one command per node at once, wait for all, return their results."""
    procs = [subprocess.Popen(node.argv(*argv), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
             for node, argv, env in zip(nodes, argvs, envs)]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for p in procs:
                kill_group(p)
            out, err = proc.communicate()
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def kill_group(proc: subprocess.Popen[str]) -> None:
    """A launcher that outlives the timeout: end it and its workers (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def ranks_seen(results: list[subprocess.CompletedProcess[str]]) -> list[int]:
    return sorted(int(m.group(1)) for r in results for m in RANK_LINE.finditer(r.stdout))


def test_full_openpai_runtime_environment_two_tasks(tmp_path: Path) -> None:
    """Role 'train_er', label 'RdzvPort' with 3 ports: both tasks join, ranks 0-3 all-reduce to 6."""
    job = load_job(HELLO)
    job = replace(job, container=ContainerSpec(image="pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"),
                  openpai=OpenPAISpec(task_role="train_er", port_label="RdzvPort", cpu=2,
                                           setup=(f"export GLOO_SOCKET_IFNAME={IFNAME}",)), nodes=2)
    spec = yaml.safe_load(render_openpai(job, str(HELLO)))
    (role_name, role), = spec["taskRoles"].items()
    line = " && ".join(command.strip() for command in role["commands"])  # as protocol.js protocolRender
    resources = role["resourcePerInstance"]
    with pai_nodes(role["instances"]) as nodes:
        task_role = TaskRole(role_name, role["instances"], tuple(n.ip for n in nodes),
                             ports={"RdzvPort": 3}, gpu=resources["gpu"], cpu=resources["cpu"],
                             memory_mb=resources["memoryMB"])
        envs = [{**base_env(), **runtime_env("alice", spec["name"], [task_role], role_name, i)}
                for i in range(len(nodes))]
        assert "PAI_HOST_IP_trainer_0" in envs[1] and len(envs[1]["PAI_trainer_0_RdzvPort_PORT"].split(",")) == 3
        results = run_on(nodes, [["bash", "-c", line]] * len(nodes), envs, tmp_path)
        leftovers = {n.name: n.pids() for n in nodes}
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "master port from PAI_trainer_0_RdzvPort_PORT" in result.stderr
    assert ranks_seen(results) == [0, 1, 2, 3]
    assert leftovers == {n.name: [] for n in nodes}
    assert sorted(os.listdir(tmp_path / "logs")) == ["alice_hello-attempt0"]  # "~" made a token character


@pytest.mark.skipif(not hasattr(Overrides(), "job"),
                    reason="clusterddp run does not hand the job file to the environments yet (Overrides.job)")
def test_seed_recipe_variables_alone_two_tasks(tmp_path: Path) -> None:
    """Only PAI_HOST_IP_worker_0, PAI_worker_0_SynPort_PORT and PAI_TASK_INDEX (+ nodes: 2): ranks 0-3."""
    job_file = tmp_path / "hello2.yaml"
    job_file.write_text(yaml.safe_dump({"name": "hello2", "script": str(REPO / "jobs" / "hello.py"),
                                        "nodes": 2, "nproc_per_node": 2}))
    with pai_nodes(2) as nodes:
        task_role = TaskRole("worker", 2, tuple(n.ip for n in nodes))
        envs = []
        for i in range(2):
            full = runtime_env("alice", "hello2", [task_role], "worker", i)
            envs.append({**base_env(), "GLOO_SOCKET_IFNAME": IFNAME, **{k: full[k] for k in SEED_VARIABLES}})
        argv = [sys.executable, "-m", "clusterddp", "run", str(job_file)]
        results = run_on(nodes, [argv, argv], envs, tmp_path)
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert ranks_seen(results) == [0, 1, 2, 3]
