"""OpenPAIEnv against the exact variables the OpenPAI runtime exports (plain dicts, no os.environ)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from pai_runtime import SEED_VARIABLES, TaskRole, convert_name, port_list, pod_uid, runtime_env

from clusterddp.envs import Overrides
from clusterddp.envs.openpai import OpenPAIEnv
from clusterddp.envs.openpai import convert_name as code_convert_name
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.sections.openpai import OpenPAISpec
from clusterddp.spec import JobSpec

IPS = ("10.151.41.8", "10.151.41.9", "10.151.41.10")


@dataclass(frozen=True)
class JobOverrides(Overrides):
    """Overrides carrying the job file, as ``clusterddp run JOB`` hands it to the environments."""

    job: JobSpec | None = None


def env_for(role: TaskRole, index: int, **kwargs: object) -> dict[str, str]:
    return runtime_env("alice", "ddp", [role], role.name, index, **kwargs)  # type: ignore[arg-type]


def placement(env: dict[str, str], overrides: Overrides | None = None):  # type: ignore[no-untyped-def]
    return OpenPAIEnv(env, overrides or Overrides()).placement()


@pytest.mark.parametrize("name, converted", [
    ("worker", "worker"), ("ps_server", "psserver"), ("Train_Role_2", "trainrole2"), ("_x", "x"),
])
def test_convert_name_matches_openpai(name: str, converted: str) -> None:
    """Role names convert like OpenPAI's convertName (lower case, only a-z0-9 kept)."""
    assert code_convert_name(name) == converted == convert_name(name)


def test_full_runtime_environment_gives_task_zero_as_master() -> None:
    """Every task of a 3-instance role agrees on task 0's IP and task 0's first port."""
    role = TaskRole("worker", 3, IPS)
    task0_port = port_list(pod_uid("alice", "ddp", "worker", 0, 0), "SynPort", 1)[0]
    for index in range(3):
        got = placement(env_for(role, index))
        assert (got.env, got.nnodes, got.node_rank) == ("openpai", 3, index)
        assert (got.master_addr, got.master_port) == (IPS[0], task0_port)
        assert got.hosts == IPS
        assert got.run_id == "alice_ddp-attempt0"  # 'alice~ddp' made a token: a directory under logs/


def test_role_with_underscore_and_capital_label_with_three_ports() -> None:
    """A role 'train_er' uses PAI_HOST_IP_trainer_0 but PAI_TASK_ROLE_TASK_COUNT_train_er; first of 3 ports."""
    role = TaskRole("train_er", 2, IPS[:2], ports={"RdzvPort": 3, "tcp": 2}, gpu=0, cpu=3)
    env = env_for(role, 1)
    env["CLUSTERDDP_OPENPAI_PORT_LABEL"] = "RdzvPort"
    assert "PAI_HOST_IP_train_er_0" not in env and "PAI_TASK_ROLE_TASK_COUNT_trainer" not in env
    three = env["PAI_trainer_0_RdzvPort_PORT"].split(",")
    assert len(three) == 3
    got = placement(env)
    assert (got.nnodes, got.node_rank, got.master_addr) == (2, 1, IPS[0])
    assert got.master_port == int(three[0])
    assert got.master_port != int(env["PAI_trainer_1_RdzvPort_PORT"].split(",")[0])
    assert got.nproc_per_node == 3  # gpu 0: the task's CPU slots


def test_job_port_label_is_used_without_the_override_variable() -> None:
    """The job file's openpai.port_label picks the rendezvous label among several."""
    role = TaskRole("worker", 2, IPS[:2], ports={"RdzvPort": 1, "Other": 1})
    job = JobSpec(name="j", script="t.py", openpai=OpenPAISpec(port_label="RdzvPort"))
    got = placement(env_for(role, 0), JobOverrides(job=job))
    assert got.master_port == int(env_for(role, 0)["PAI_worker_0_RdzvPort_PORT"])


def test_single_custom_label_is_found_without_configuration() -> None:
    """With one label besides ssh/http the environment finds it alone."""
    role = TaskRole("worker", 2, IPS[:2], ports={"MyPort": 2})
    env = env_for(role, 0)
    assert placement(env).master_port == int(env["PAI_PORT_LIST_worker_0_MyPort"].split(",")[0])


def test_several_labels_without_a_choice_is_an_error_naming_them() -> None:
    """Two candidate labels and none configured: an error lists them and says how to choose."""
    role = TaskRole("worker", 2, IPS[:2], ports={"A": 1, "B": 1})
    with pytest.raises(EnvironmentDetectionError, match=r"A, B.*port_label"):
        placement(env_for(role, 0))


def test_no_label_means_a_derived_port_with_a_note() -> None:
    """A role with only ssh/http ports leaves the port to the topology (derived) and says so."""
    role = TaskRole("worker", 2, IPS[:2], ports={})
    got = placement(env_for(role, 1))
    assert got.master_port is None
    assert any("derived" in note for note in got.notes)


def test_forced_label_that_does_not_exist_is_an_error() -> None:
    """CLUSTERDDP_OPENPAI_PORT_LABEL naming a missing label fails and lists the real ones."""
    env = env_for(TaskRole("worker", 2, IPS[:2]), 0)
    env["CLUSTERDDP_OPENPAI_PORT_LABEL"] = "Nope"
    with pytest.raises(EnvironmentDetectionError, match=r"PAI_worker_0_Nope_PORT.*SynPort"):
        placement(env)


def test_port_list_variable_alone_is_enough() -> None:
    """PAI_PORT_LIST_<r>_0_<label> works when PAI_<r>_0_<label>_PORT is absent."""
    env = {"PAI_TASK_INDEX": "1", "PAI_TASK_ROLE_TASK_COUNT_worker": "2", "PAI_HOST_IP_worker_0": "10.0.0.1",
           "PAI_PORT_LIST_worker_0_SynPort": "23456,23457"}
    got = placement(env)
    assert (got.master_addr, got.master_port, got.node_rank) == ("10.0.0.1", 23456, 1)


def test_seed_variables_alone_with_the_job_nodes() -> None:
    """The seed recipe's three variables plus the job file's nodes place both tasks."""
    role = TaskRole("worker", 2, IPS[:2])
    job = JobSpec(name="j", script="t.py", nodes=2)
    for index in range(2):
        full = env_for(role, index)
        seed = {name: full[name] for name in SEED_VARIABLES}
        got = placement(seed, JobOverrides(job=job))
        assert (got.nnodes, got.node_rank) == (2, index)
        assert (got.master_addr, got.master_port) == (IPS[0], int(full["PAI_worker_0_SynPort_PORT"]))
        assert got.nproc_per_node is None and got.run_id is None


def test_seed_variables_without_a_job_say_what_is_missing() -> None:
    """Without PAI_TASK_ROLE_TASK_COUNT_<role>, a job file or any task IP the error names the variable."""
    with pytest.raises(EnvironmentDetectionError, match="PAI_TASK_ROLE_TASK_COUNT_worker"):
        placement({"PAI_TASK_INDEX": "0", "PAI_worker_0_SynPort_PORT": "2000"})


def test_seed_variables_without_a_job_count_the_task_ips() -> None:
    """The seed's variables and every task's IP, no job file: the count comes from the IPs, with a note."""
    role = TaskRole("worker", 3, IPS)
    for index in range(3):
        full = env_for(role, index)
        seed = {name: full[name] for name in SEED_VARIABLES}
        seed.update({f"PAI_HOST_IP_worker_{i}": ip for i, ip in enumerate(IPS)})
        got = placement(seed)
        assert (got.nnodes, got.node_rank, got.master_addr, got.hosts) == (3, index, IPS[0], IPS)
        assert any("counted from the task IPs PAI_HOST_IP_worker_0..PAI_HOST_IP_worker_2" in n for n in got.notes)


def test_task_ips_with_a_gap_do_not_give_a_count() -> None:
    """IPs of tasks 0 and 2 without task 1: the count is unknown, and the error names the stray variable."""
    env = {"PAI_TASK_INDEX": "0", "PAI_HOST_IP_worker_0": IPS[0], "PAI_HOST_IP_worker_2": IPS[2]}
    with pytest.raises(EnvironmentDetectionError, match=r"PAI_HOST_IP_worker_2: .*not contiguous"):
        placement(env)


def test_runtime_count_and_job_file_win_over_the_task_ips() -> None:
    """PAI_TASK_ROLE_TASK_COUNT_<role>, then the job's nodes, come before counting IPs (no note then)."""
    env = {"PAI_TASK_INDEX": "0", **{f"PAI_HOST_IP_worker_{i}": ip for i, ip in enumerate(IPS)}}
    assert placement({**env, "PAI_TASK_ROLE_TASK_COUNT_worker": "2"}).nnodes == 2
    got = placement(env, JobOverrides(job=JobSpec(name="j", script="t.py", nodes=2)))
    assert got.nnodes == 2 and not any("counted" in note for note in got.notes)


def test_non_gang_allocation_is_a_clear_error() -> None:
    """Without gang allocation task 1 has no PAI_HOST_IP_worker_0: the error says to enable it."""
    env = env_for(TaskRole("worker", 2, IPS[:2]), 1, gang=False)
    assert "PAI_HOST_IP_worker_0" not in env
    with pytest.raises(EnvironmentDetectionError, match=r"PAI_HOST_IP_worker_0.*gangAllocation: true"):
        placement(env)


def test_single_instance_without_ip_uses_loopback() -> None:
    """One instance needs no other task's IP: the master is this node on loopback."""
    env = {"PAI_TASK_INDEX": "0", "PAI_TASK_ROLE_TASK_COUNT_worker": "1"}
    assert placement(env).master_addr == "127.0.0.1"


def test_raw_role_spelling_is_accepted_for_hand_made_environments() -> None:
    """PAI_HOST_IP_ps_server_0 (unconverted) still works when the converted name is absent."""
    env = {"PAI_CURRENT_TASK_ROLE_NAME": "ps_server", "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": "0",
           "PAI_TASK_ROLE_TASK_COUNT_ps_server": "2", "PAI_HOST_IP_ps_server_0": "10.0.0.7",
           "PAI_ps_server_0_SynPort_PORT": "24000"}
    got = placement(env)
    assert (got.master_addr, got.master_port) == ("10.0.0.7", 24000)


def test_current_task_index_wins_over_the_old_alias() -> None:
    """PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX is read before PAI_TASK_INDEX."""
    env = env_for(TaskRole("worker", 3, IPS), 2)
    env["PAI_TASK_INDEX"] = "0"
    assert placement(env).node_rank == 2


@pytest.mark.parametrize("resource, nproc", [("4,16,32768,0", 4), ("0,6,8192,512", 6), ("0,0,1024,0", None)])
def test_nproc_hint_is_gpus_else_cpu_slots(resource: str, nproc: int | None) -> None:
    """PAI_RESOURCE_<role>: its GPUs, or its CPU slots on a CPU task (not the host's cores)."""
    env = env_for(TaskRole("worker", 2, IPS[:2]), 0)
    env["PAI_RESOURCE_worker"] = resource
    assert placement(env).nproc_per_node == nproc


@pytest.mark.parametrize("name, value, message", [
    ("PAI_RESOURCE_worker", "lots", "PAI_RESOURCE_worker: expected '<gpu>,<cpu>"),
    ("PAI_worker_0_SynPort_PORT", "http,22", "does not start with a port number"),
    ("PAI_worker_0_SynPort_PORT", "70000", "does not start with a port number"),
    ("PAI_TASK_ROLE_TASK_COUNT_worker", "two", "PAI_TASK_ROLE_TASK_COUNT_worker: expected an integer"),
    ("PAI_TASK_ROLE_TASK_COUNT_worker", "1", r"task index 1 is outside 0\.\.0"),
    ("PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX", "x", "_INDEX: expected an integer"),
])
def test_bad_values_name_the_variable(name: str, value: str, message: str) -> None:
    """A malformed variable gives an error naming it and its value, not a traceback."""
    env = env_for(TaskRole("worker", 2, IPS[:2]), 1)
    env[name] = value
    with pytest.raises(EnvironmentDetectionError, match=message):
        placement(env)


def test_run_id_is_the_job_id_and_attempt_and_cli_wins() -> None:
    """run id = <user>_<job>-attempt<N> (a job retry gets fresh logs); --run-id overrides it."""
    env = env_for(TaskRole("worker", 2, IPS[:2]), 0, attempt=3)
    assert placement(env).run_id == "alice_ddp-attempt3"
    assert placement(env, Overrides(run_id="mine")).run_id == "mine"


def test_detection_needs_a_task_index_and_reads_only_the_mapping() -> None:
    """Detected only with a task index; other PAI_* variables alone do not count."""
    assert not OpenPAIEnv({"PAI_JOB_NAME": "a~b", "PAI_HOST_IP_worker_0": "1.2.3.4"}, Overrides()).detected()
    assert OpenPAIEnv({"PAI_TASK_INDEX": "0"}, Overrides()).detected()


def test_placement_changes_nothing() -> None:
    """Reading the placement leaves the given mapping untouched."""
    env = env_for(TaskRole("worker", 2, IPS[:2]), 0)
    before = dict(env)
    placement(env, JobOverrides(job=JobSpec(name="j", script="t.py", nodes=2)))
    assert env == before


def test_detection_order_places_openpai_after_torchrun_and_before_slurm() -> None:
    """detect(): OpenPAI's variables win over SLURM's, an outer torchrun's win over OpenPAI's."""
    from clusterddp.envs import detect

    env = env_for(TaskRole("worker", 2, IPS[:2]), 1)
    assert detect(env).name == "openpai"
    assert detect({**env, "SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1"}).name == "openpai"
    assert detect({**env, "MASTER_ADDR": "10.0.0.9", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"}).name == "torchrun"


# --- job retries: OpenPAI restarts the whole job; FC_FRAMEWORK_ATTEMPT_ID counts the attempts ---

def test_framework_attempt_is_the_restart_count_with_a_note() -> None:
    """FC_FRAMEWORK_ATTEMPT_ID (0 first, +1 per whole-job retry) is this start's restart count."""
    role = TaskRole("worker", 2, IPS[:2])
    for attempt in (0, 2):
        got = placement(env_for(role, 1, attempt=attempt))
        assert got.restart_count == attempt
        assert f"job attempt {attempt} (FC_FRAMEWORK_ATTEMPT_ID): OpenPAI retries the whole job" in " ".join(got.notes)
    env = env_for(role, 0)
    del env["FC_FRAMEWORK_ATTEMPT_ID"]
    assert placement(env).restart_count == 0  # hand-made environment: still OpenPAI's restarts, attempt 0
    with pytest.raises(EnvironmentDetectionError, match="openpai: FC_FRAMEWORK_ATTEMPT_ID: "):
        placement({**env, "FC_FRAMEWORK_ATTEMPT_ID": "-1"})


def test_workers_get_the_attempt_and_the_node_never_restarts_alone(tmp_path: Path) -> None:
    """Under OpenPAI attempt 2 every planned worker has TORCHELASTIC_RESTART_COUNT=2 and the
    supervisor restarts nothing (restarts: 3 is OpenPAI's); --restart-count still wins."""
    from clusterddp.launch.supervise.supervisor import supervisor_options
    from clusterddp.launch.options import RunOptions
    from clusterddp.launch.start.node import plan_node

    job = JobSpec(name="j", script="t.py", nodes=2, nproc_per_node=2, backend="gloo", restarts=3,
                  cpu_affinity="none")
    env = env_for(TaskRole("worker", 2, IPS[:2]), 1, attempt=2)
    node = plan_node(job, RunOptions(), env, str(tmp_path))
    assert node.topology.restart_count == 2
    supervision = supervisor_options(node, RunOptions())
    assert (supervision.restarts, supervision.first_attempt) == (0, 2)
    envs = [p.env.build(supervision.first_attempt) for p in node.plans]
    assert [(e["RANK"], e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"])
            for e in envs] == [("2", "2", "3"), ("3", "2", "3")]
    flagged = plan_node(job, RunOptions(restart_count=5), env, str(tmp_path))
    assert supervisor_options(flagged, RunOptions()).first_attempt == 5


def test_outside_openpai_the_nodes_own_restarts_still_apply() -> None:
    """Placed by hand (no scheduler restarting the job), restarts: 3 restarts the local group."""
    from clusterddp.launch.supervise.supervisor import supervisor_options
    from clusterddp.launch.options import RunOptions
    from clusterddp.launch.start.node import plan_node

    job = JobSpec(name="j", script="t.py", nodes=2, nproc_per_node=1, backend="gloo", restarts=3)
    options = RunOptions(nnodes=2, node_rank=1, master_addr="10.0.0.5", master_port=29500)
    node = plan_node(job, options, {}, "/tmp")
    assert node.topology.restart_count is None
    supervision = supervisor_options(node, options)
    assert (supervision.restarts, supervision.first_attempt) == (3, 0)


def test_dry_run_under_openpai_shows_the_attempt(tmp_path: Path) -> None:
    """'clusterddp run JOB --dry-run' in a recreated OpenPAI task (attempt 1) shows
    TORCHELASTIC_RESTART_COUNT=1 for each worker and says the node never restarts alone."""
    from tests.conftest import cli, cli_env

    (tmp_path / "t.py").write_text("", encoding="utf-8")
    job = tmp_path / "job.yaml"
    job.write_text("name: j\nscript: t.py\nnodes: 2\nnproc_per_node: 2\nbackend: gloo\nrestarts: 2\n"
                   "cpu_affinity: none\ncontainer:\n  image: img:1\n", encoding="utf-8")
    env = env_for(TaskRole("worker", 2, IPS[:2]), 0, attempt=1)
    result = cli("run", str(job), "--dry-run", "--log-dir", str(tmp_path / "logs"), env=cli_env(**env))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "environment: openpai;" in out and "run id alice_ddp-attempt1" in out
    assert "note: job attempt 1 (FC_FRAMEWORK_ATTEMPT_ID): OpenPAI retries the whole job" in out
    assert out.count("  TORCHELASTIC_RESTART_COUNT=1\n") == 2
    assert out.count("  TORCHELASTIC_MAX_RESTARTS=2\n") == 2


def test_a_failing_single_task_job_is_not_restarted_by_its_launcher(tmp_path: Path) -> None:
    """A real run in a recreated 1-instance OpenPAI task: with restarts: 2 the launcher runs the
    workers once (attempt 0, from FC_FRAMEWORK_ATTEMPT_ID) and exits with the failure, for
    OpenPAI to retry the job; on the retry (attempt 1) the workers see 1 and succeed."""
    from tests.conftest import BIN, cli, cli_env

    job = tmp_path / "job.yaml"
    job.write_text(f"name: j\nscript: {BIN / 'fail_once.py'}\nnodes: 1\nnproc_per_node: 2\nbackend: gloo\n"
                   "restarts: 2\ncpu_affinity: none\ngrace_period: 1\n", encoding="utf-8")
    role = TaskRole("worker", 1, ("127.0.0.1",))
    first = cli("run", str(job), "--log-dir", str(tmp_path / "logs"),
                env=cli_env(**env_for(role, 0, attempt=0)), timeout=600)
    assert first.returncode == 7, first.stdout + first.stderr
    assert "attempt 1" not in first.stdout and "restart 1 of 2" not in first.stdout + first.stderr
    retry = cli("run", str(job), "--log-dir", str(tmp_path / "logs"),
                env=cli_env(**env_for(role, 0, attempt=1)), timeout=600)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert "rank 1 attempt 1" in retry.stdout
