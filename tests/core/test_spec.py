"""Job file loading: valid files become typed specs; each malformed one gives one line, exit 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from clusterddp.errors import JobSpecError
from clusterddp.spec import JobSpec, load_job
from tests.conftest import REPO, cli

SCRIPT_LINE = "script: {script}\n"

# (name, yaml text after the script line, expected fragment, expected line or None)
MALFORMED = [
    ("unknown_top_key", "nprocs_per_node: 2\n", "nprocs_per_node: unknown key (hint: did you mean 'nproc_per_node'?)", 2),
    ("unknown_nested_key", "master:\n  adr: x\n", "master.adr: unknown key (hint: did you mean 'addr'?)", 3),
    ("unknown_ssh_key", "ssh:\n  hostz: [a]\n", "ssh.hostz: unknown key (hint: did you mean 'hosts'?)", 3),
    ("unknown_slurm_key", "slurm:\n  partitoin: gpu\n", "slurm.partitoin: unknown key (hint: did you mean 'partition'?)", 3),
    ("unknown_openpai_key", "openpai:\n  virtual_clustr: x\n", "openpai.virtual_clustr: unknown key (hint: did you mean 'virtual_cluster'?)", 3),
    ("unknown_logs_key", "logs:\n  dirr: x\n", "logs.dirr: unknown key (hint: did you mean 'dir'?)", 3),
    ("nodes_string", "nodes: two\n", "nodes: expected an integer or 'MIN:MAX' (like torchrun's --nnodes 3:4), got str 'two'", 2),
    ("nodes_zero", "nodes: 0\n", "nodes: must be > 0, got 0", 2),
    ("nodes_float", "nodes: 1.5\n", "nodes: expected an integer", 2),
    ("nproc_word", "nproc_per_node: many\n", "nproc_per_node: expected an integer or one of", 2),
    ("nproc_zero", "nproc_per_node: 0\n", "nproc_per_node: must be >= 1", 2),
    ("backend_typo", "backend: glooo\n", "backend: expected one of 'auto', 'nccl', 'gloo', got 'glooo' (hint: did you mean 'gloo'?)", 2),
    ("args_mapping", "args: {a: 1}\n", "args: expected a list, got a mapping", 2),
    ("args_bool", "args: [--flag, yes]\n", "args[1]: expected a string, got bool 'yes'", 2),
    ("env_list", "env: [A, B]\n", "env: expected a mapping, got a list", 2),
    ("env_bad_name", "env:\n  1BAD: x\n", "env: invalid environment variable name '1BAD'", 3),
    ("env_nested", "env:\n  A: {b: c}\n", "env.A: expected a string, got a mapping", 3),
    ("master_port_range", "master:\n  port: 70000\n", "master.port: port must be 1-65535, got 70000", 3),
    ("master_port_string", "master:\n  port: http\n", "master.port: expected an integer", 3),
    ("master_scalar", "master: 10.0.0.1\n", "master: expected a mapping", 2),
    ("restarts_negative", "restarts: -1\n", "restarts: must be >= 0, got -1", 2),
    ("grace_negative", "grace_period: -3\n", "grace_period: must be >= 0", 2),
    ("forward_signal_unknown", "forward_signals: [SIGFOO]\n", "forward_signals[0]: unknown signal 'SIGFOO'", 2),
    ("hang_timeout_zero", "hang_timeout: 0\n", "hang_timeout: must be > 0", 2),
    ("logs_ranks_words", "logs:\n  ranks: [zero]\n", "logs.ranks[0]: expected an integer", 3),
    ("logs_prefix_string", "logs:\n  prefix: maybe\n", "logs.prefix: expected true/false", 3),
    ("ssh_port_string", "ssh:\n  port: twenty-two\n", "ssh.port: expected an integer, got str 'twenty-two'", 3),
    ("ssh_hosts_scalar", "ssh:\n  hosts: node1\n", "ssh.hosts: expected a list", 3),
    ("ssh_accept_string", "ssh:\n  accept_new_host_keys: sometimes\n", "ssh.accept_new_host_keys: expected true/false", 3),
    ("slurm_cpus_zero", "slurm:\n  cpus_per_task: 0\n", "slurm.cpus_per_task: must be > 0", 3),
    ("slurm_extra_scalar", "slurm:\n  extra_sbatch: --foo\n", "slurm.extra_sbatch: expected a list", 3),
    ("openpai_cpu_negative", "openpai:\n  cpu: -1\n", "openpai.cpu: must be > 0", 3),
    ("duplicate_key", "nodes: 1\nnodes: 2\n", "nodes: duplicate key (first given on line 2)", 3),
    ("name_bad", "name: 'my job!'\n", "name: must be a name of letters", 2),
    ("section_list", "ssh: [a, b]\n", "ssh: expected a mapping, got a list", 2),
    ("python_number", "python: [python3]\n", "python: expected a string, got a list", 2),
    ("internal_key", "source: x.yaml\n", "source: unknown key", 2),
]


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SCRIPT_LINE.format(script=REPO / "jobs" / "hello.py") + body)
    return path


@pytest.mark.parametrize("name,body,fragment,line", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_job_names_file_line_and_key(tmp_path: Path, name: str, body: str, fragment: str, line: int) -> None:
    """Each malformed job file raises one JobSpecError naming file:line and the key path."""
    path = _write(tmp_path, name, body)
    with pytest.raises(JobSpecError) as info:
        load_job(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert fragment in message, message
    assert "\n" not in message


OTHER_BROKEN = [
    ("syntax", "script: [unclosed\n", ":2: invalid YAML"),
    ("tabs", "name: x\n\tnodes: 2\n", "invalid YAML"),
    ("empty", "", "the job file is empty"),
    ("not_mapping", "- a\n- b\n", ":1: expected a mapping for the job file, got a list"),
    ("no_script", "name: x\n", "script: missing what to run"),
    ("both", "script: a.py\nmodule: b\n", "give either 'script' or 'module', not both"),
    ("missing_script_file", "script: nowhere.py\n", ":1: script: no such file"),
]


@pytest.mark.parametrize("name,text,fragment", OTHER_BROKEN, ids=[b[0] for b in OTHER_BROKEN])
def test_broken_files_without_script_line(tmp_path: Path, name: str, text: str, fragment: str) -> None:
    """Syntax errors, empty files and missing entry points are one line naming the file."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    with pytest.raises(JobSpecError) as info:
        load_job(path)
    assert str(info.value).startswith(str(path)), str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize("name,body,fragment,line", MALFORMED[:12] + MALFORMED[-6:],
                         ids=[m[0] for m in MALFORMED[:12] + MALFORMED[-6:]])
def test_cli_prints_one_line_and_exits_2(tmp_path: Path, name: str, body: str, fragment: str, line: int) -> None:
    """Through the real CLI: exactly one stderr line with file:line, exit 2, no traceback, no logs."""
    path = _write(tmp_path, name, body)
    result = cli("run", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{path}:{line}: " in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "logs").exists()


def test_missing_job_file_is_one_line(tmp_path: Path) -> None:
    """A job file that does not exist: one line naming it, exit 2."""
    result = cli("run", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "nope.yaml: no such job file" in result.stderr


def test_valid_job_is_typed_and_frozen(tmp_path: Path) -> None:
    """A full job file loads into nested frozen dataclasses with defaults filled in."""
    path = tmp_path / "full.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: full
        script: {REPO / 'jobs' / 'hello.py'}
        args: [--epochs, 3, --lr, 0.1]
        nodes: 2
        nproc_per_node: gpu
        env: {{OMP_NUM_THREADS: 4, NAME: x}}
        master: {{addr: 10.0.0.1, port: 29500}}
        logs: {{ranks: [0, 1], prefix: false}}
        ssh: {{hosts: [a, b], port: 2222}}
        slurm: {{partition: gpu, gpus_per_node: 8}}
        container: {{image: pytorch/pytorch:latest}}
        """))
    job = load_job(path)
    assert job.args == ("--epochs", "3", "--lr", "0.1")
    assert job.nproc_per_node == "gpu" and job.nodes == 2
    assert dict(job.env) == {"OMP_NUM_THREADS": "4", "NAME": "x"}
    assert job.master.port == 29500 and job.logs.ranks == (0, 1) and job.logs.prefix is False
    assert job.ssh.hosts == ("a", "b") and job.ssh.port == 2222
    assert job.slurm.partition == "gpu" and job.container.image == "pytorch/pytorch:latest"
    with pytest.raises(Exception):
        job.nodes = 3  # type: ignore[misc]


def test_script_is_relative_to_the_job_file(tmp_path: Path) -> None:
    """script: is taken relative to the job file's directory, module: runs with -m."""
    (tmp_path / "train.py").write_text("")
    (tmp_path / "a.yaml").write_text("script: train.py\nargs: [x]\n")
    job = load_job(tmp_path / "a.yaml")
    assert job.entry_argv() == [str(tmp_path / "train.py"), "x"]
    assert job.name == "a"
    (tmp_path / "b.yaml").write_text("module: pkg.train\n")
    assert load_job(tmp_path / "b.yaml").entry_argv() == ["-m", "pkg.train"]


def test_example_jobs_load() -> None:
    """Every job file shipped in jobs/ is valid."""
    for path in sorted((REPO / "jobs").glob("*.yaml")):
        assert isinstance(load_job(path), JobSpec)


def test_malformed_table_is_large_enough() -> None:
    """The issue asks for 30+ malformed job files."""
    assert len(MALFORMED) + len(OTHER_BROKEN) >= 30


@pytest.mark.parametrize("body,expected", [
    ("name: x\npython: /no/such/python\n", ":3: python: '/no/such/python' is not an executable file"),
    ("name: x\nworkdir: /no/such/dir\n", ":3: workdir: '/no/such/dir' is not a directory"),
])
def test_checks_after_loading_still_name_the_line(tmp_path: Path, body: str, expected: str) -> None:
    """A value that parses but cannot be used (missing interpreter, workdir) names its line; nothing starts."""
    path = _write(tmp_path, "late", body)
    result = cli("run", str(path), cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"{path}{expected}" in result.stderr
    assert not (tmp_path / "logs").exists()
