"""Hostile flags, CLUSTERDDP_* variables and hostfiles: the same validators as the job-file key
each overrides, one line ``where: problem``, exit 2, nothing created, nothing started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterddp import cli as cli_module
from clusterddp import validate
from tests.conftest import REPO, cli, cli_env


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A valid one-worker job whose worker leaves a marker; cwd is tmp_path; no CLUSTERDDP_* set."""
    for name in list(os.environ):
        if name.startswith("CLUSTERDDP_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(tmp_path / 'worker-started')!r}, 'w').close()\n")
    path = tmp_path / "job.yaml"
    path.write_text(f"script: {script}\nnproc_per_node: 1\n")
    (tmp_path / "a-file").write_text("")
    (tmp_path / "binary.hosts").write_bytes(b"node1\n\xff\xfe\n")
    (tmp_path / "escape.hosts").write_text("node1\nno\x1b[2Jde\n")
    (tmp_path / "slots.hosts").write_text("node1 slots=100000000000000000000000000\n")
    (tmp_path / "option.hosts").write_text("node1\n-oProxyCommand=touch\n")
    (tmp_path / "ls.hosts").write_text("a\u2028b\n")
    os.mkfifo(tmp_path / "fifo.hosts")
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli_module.main(argv)
    return code, capsys.readouterr().err


# (id, argv after 'run JOB' ('JOB' is replaced), variables, expected text after 'clusterddp: error: ')
FLAG_CASES = [
    ("port-99999", ["--master-port", "99999"], {}, "--master-port: port must be 1-65535, got 99999"),
    ("port-0", ["--master-port", "0"], {}, "--master-port: port must be 1-65535, got 0"),
    ("port-negative", ["--master-port=-1"], {}, "--master-port: port must be 1-65535, got -1"),
    ("port-word", ["--master-port", "http"], {}, "--master-port: expected an integer, got 'http'"),
    ("port-blank", ["--master-port", " 80"], {}, "--master-port: expected an integer"),
    ("port-unicode-digit", ["--master-port", "٣"], {}, "--master-port: expected an integer"),
    ("port-underscore", ["--master-port", "2_9500"], {}, "--master-port: expected an integer"),
    ("grace-negative", ["--grace-period=-1"], {}, "--grace-period: must be >= 0, got -1.0"),
    ("grace-nan", ["--grace-period", "nan"], {}, "--grace-period: expected a number, got 'nan'"),
    ("grace-inf", ["--grace-period", "inf"], {}, "--grace-period: expected a number"),
    ("grace-huge-exponent", ["--grace-period", "1e999"], {}, "--grace-period: "),
    ("restarts-negative", ["--restarts=-3"], {}, "--restarts: must be >= 0, got -3"),
    ("restarts-float", ["--restarts", "1.5"], {}, "--restarts: expected an integer"),
    ("run-id-traversal", ["--run-id", "../../x"], {}, "--run-id: must be a run id"),
    ("run-id-slash", ["--run-id", "a/b"], {}, "--run-id: must be a run id"),
    ("run-id-newline", ["--run-id", "a\nb"], {}, "--run-id: must be a run id"),
    ("run-id-empty", ["--run-id", ""], {}, "--run-id: must be a run id"),
    ("run-id-long", ["--run-id", "x" * 300], {}, "--run-id: a run id of at most 128 characters"),
    ("nnodes-zero", ["--nnodes", "0"], {}, "--nnodes: must be > 0, got 0"),
    ("nnodes-huge", ["--nnodes", "100000"], {}, "--nnodes: 100000 nodes is over the bound of 65536"),
    ("nnodes-1e26", ["--nnodes", "1" + "0" * 26], {}, "--nnodes: expected an integer"),
    ("node-rank-negative", ["--node-rank=-1"], {}, "--node-rank: must be 0-65535, got -1"),
    ("node-rank-outside", ["--nnodes", "2", "--node-rank", "5", "--master-addr", "10.0.0.1"], {},
     "--node-rank 5 is outside 0..1"),
    ("restart-count-negative", ["--restart-count=-1"], {}, "--restart-count: must be >= 0, got -1"),
    ("restart-count-word", ["--restart-count", "x"], {}, "--restart-count: expected an integer, got 'x'"),
    ("restart-count-variable", [], {"CLUSTERDDP_RESTART_COUNT": "1e3"}, "CLUSTERDDP_RESTART_COUNT: expected an integer"),
    ("workers-per-node-empty", ["--workers-per-node", ""], {}, "--workers-per-node: expected worker counts like 2,1,1"),
    ("workers-per-node-zero", ["--workers-per-node", "2,0"], {}, "--workers-per-node: must be >= 1, got 0"),
    ("workers-per-node-negative", ["--workers-per-node", "2,-1"], {}, "--workers-per-node: must be >= 1, got -1"),
    ("workers-per-node-huge", ["--workers-per-node", "100000"], {}, "--workers-per-node: 100000 workers on one node"),
    ("workers-per-node-binary", ["--workers-per-node", "2,\x00\x1b"], {}, "--workers-per-node: expected worker counts"),
    ("workers-per-node-newline", ["--workers-per-node", "2\n1"], {}, "--workers-per-node: expected worker counts"),
    ("workers-per-node-too-many", ["--workers-per-node", ",".join(["1"] * 70000)], {},
     "--workers-per-node: expected worker counts"),
    ("workers-per-node-mismatch", ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                                   "--nproc-per-node", "1", "--workers-per-node", "2,1,1"], {},
     "--workers-per-node gives 3 node(s) but the job has 2 (placement: explicit)"),
    ("workers-per-node-not-mine", ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                                   "--nproc-per-node", "1", "--workers-per-node", "1,2"], {},
     "--workers-per-node gives node 1 2 worker(s) but it runs 1 (--nproc-per-node)"),
    ("nproc-zero", ["--nproc-per-node", "0"], {}, "--nproc-per-node: must be >= 1, got 0"),
    ("nproc-100k", ["--nproc-per-node", "100000"], {}, "--nproc-per-node: 100000 workers on one node is over"),
    ("nproc-word", ["--nproc-per-node", "many"], {}, "--nproc-per-node: expected a number, 'auto', 'gpu' or 'cpu'"),
    ("master-addr-option", ["--master-addr=-oProxyCommand=x", "--node-rank", "0"], {},
     "--master-addr: expected a host name or IP address"),
    ("master-addr-space", ["--master-addr", "a b"], {}, "--master-addr: expected a host name or IP address"),
    ("log-dir-file", ["--log-dir", "a-file"], {}, "--log-dir: "),
    ("log-dir-under-file", ["--log-dir", "a-file/sub"], {}, "--log-dir: "),
    ("log-dir-newline", ["--log-dir", "a\nb"], {}, "--log-dir: contains the control character"),
    ("log-dir-empty", ["--log-dir", ""], {}, "--log-dir: must not be empty"),
    ("python-missing", ["--python", "/no/such/python"], {}, "--python: '/no/such/python' is not an executable file"),
    ("python-bare-missing", ["--python", "no-such-python-here"], {}, "--python: 'no-such-python-here' is not on"),
    ("python-directory", ["--python", "/tmp"], {}, "--python: '/tmp' is a directory"),
    ("python-not-executable", ["--python", "a-file"], {}, "--python: 'a-file' is not on"),
    ("python-empty", ["--python", ""], {}, "--python: must not be empty"),
    ("log-ranks-word", ["--log-ranks", "zero"], {}, "--log-ranks: expected ranks like 0,3"),
    ("log-ranks-negative", ["--log-ranks=-1"], {}, "--log-ranks: expected ranks like 0,3"),
    ("heartbeat-zero", ["--keepalive-timeout", "0"], {}, "--keepalive-timeout: must be > 0"),
    ("hostfile-missing", ["--hostfile", "nope.hosts", "--dry-run"], {}, "nope.hosts: no such hostfile"),
    ("hostfile-fifo", ["--hostfile", "fifo.hosts", "--dry-run"], {}, "fifo.hosts: the hostfile is not a regular file"),
    ("hostfile-dev-zero", ["--hostfile", "/dev/zero", "--dry-run"], {}, "/dev/zero: the hostfile is not a regular file"),
    ("hostfile-binary", ["--hostfile", "binary.hosts", "--dry-run"], {}, "binary.hosts:2: not UTF-8 text"),
    ("hostfile-escape", ["--hostfile", "escape.hosts", "--dry-run"], {}, "escape.hosts:2: the line contains the control"),
    ("hostfile-slots", ["--hostfile", "slots.hosts", "--dry-run"], {}, "slots.hosts:1: 'slots=1"),
    ("hostfile-option", ["--hostfile", "option.hosts", "--dry-run"], {}, "option.hosts:2: '-oProxyCommand=touch' is not"),
    ("hostfile-line-separator", ["--hostfile", "ls.hosts", "--dry-run"], {}, "ls.hosts:1: the line contains"),
    ("include-newline", ["--hostfile", "slots.hosts", "--include", "a\nb"], {}, "--include: contains the control"),
    ("env-nnodes", [], {"CLUSTERDDP_NNODES": "x"}, "CLUSTERDDP_NNODES: expected an integer, got 'x'"),
    ("env-master-port", [], {"CLUSTERDDP_MASTER_PORT": "99999"}, "CLUSTERDDP_MASTER_PORT: port must be 1-65535, got 99999"),
    ("env-nproc", [], {"CLUSTERDDP_NPROC_PER_NODE": "100000"}, "CLUSTERDDP_NPROC_PER_NODE: 100000 workers"),
    ("env-run-id", [], {"CLUSTERDDP_RUN_ID": "../x"}, "CLUSTERDDP_RUN_ID: must be a run id"),
    ("env-node-rank", [], {"CLUSTERDDP_NODE_RANK": "-1"}, "CLUSTERDDP_NODE_RANK: must be 0-65535, got -1"),
    ("env-master-addr", [], {"CLUSTERDDP_MASTER_ADDR": "a;b"}, "CLUSTERDDP_MASTER_ADDR: expected a host name"),
    ("env-hostfile", [], {"CLUSTERDDP_HOSTFILE": "/dev/zero"}, "/dev/zero: the hostfile is not a regular file"),
    ("env-max-workers", [], {"CLUSTERDDP_MAX_WORKERS_PER_NODE": "lots"},
     "CLUSTERDDP_MAX_WORKERS_PER_NODE: expected an integer from 1 to"),
]


@pytest.mark.parametrize("name,flags,variables,expected", FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_flag_or_variable_is_one_line_and_starts_nothing(job: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, name: str,
                                                         flags: list[str], variables: dict[str, str],
                                                         expected: str) -> None:
    """Each hostile flag or CLUSTERDDP_* value: exit 2, one line naming the flag or variable, no logs, no worker."""
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    code, err = _run(["run", str(job), *flags], capsys)
    assert code == 2, err
    assert err.startswith("clusterddp: error: ") and err.count("\n") == 1, err
    assert expected in err, err
    assert not (job.parent / "logs").exists() and not (job.parent / "worker-started").exists()


# argparse's own errors are checked for what they name (the command, the flag or word refused),
# never for argparse's wording, which changes between Python releases.
PARSER_CASES: list[tuple[str, list[str], str | tuple[str, ...]]] = [
    ("unknown-flag", ["run", "JOB", "--bogus"], "--bogus"),
    ("missing-value", ["run", "JOB", "--master-port"], "run: --master-port"),
    ("unknown-command", ["frob"], "'frob'"),
    ("render-no-scheduler", ["render"], ("render: ", "scheduler")),
    ("command-missing-script", ["run", "--nproc-per-node", "1", "--", "missing.py"],
     "<command line>: script: no such file"),
    ("command-m-without-module", ["run", "--", "-m"], "<command line>: module: '-m' needs a module name"),
    ("command-bad-module", ["run", "--", "-m", "os;touch x"], "<command line>: module: expected a dotted"),
    ("command-newline-script", ["run", "--", "a\nb.py"], "<command line>: script: contains the control"),
    ("job-and-command", ["run", "JOB", "--", "x.py"], "not both"),
    ("job-path-newline", ["run", "a\nb.yaml"], "JOB: contains the control character '\\n'"),
    ("env-command-variable", ["env"], "CLUSTERDDP_NNODES: expected an integer"),
    ("openpai-timeout-nan", ["status", "openpai", "u~j", "--url", "http://127.0.0.1:9/", "--timeout", "nan"],
     ("clusterddp status openpai: ", "--timeout")),
    ("openpai-timeout-inf", ["status", "openpai", "u~j", "--url", "http://127.0.0.1:9/", "--timeout", "inf"],
     ("clusterddp status openpai: ", "--timeout")),
    ("openpai-timeout-negative", ["status", "openpai", "u~j", "--url", "http://127.0.0.1:9/", "--timeout", "-1"],
     ("clusterddp status openpai: ", "--timeout")),
    ("openpai-timeout-zero", ["status", "openpai", "u~j", "--url", "http://127.0.0.1:9/", "--timeout", "0"],
     ("clusterddp status openpai: ", "--timeout")),
    ("openpai-timeout-huge", ["status", "openpai", "u~j", "--url", "http://127.0.0.1:9/", "--timeout", "1e400"],
     ("clusterddp status openpai: ", "--timeout")),
]


@pytest.mark.parametrize("name,argv,expected", PARSER_CASES, ids=[c[0] for c in PARSER_CASES])
def test_parser_errors_are_one_line(job: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                    name: str, argv: list[str], expected: str | tuple[str, ...]) -> None:
    """argparse's own errors and a bad command after '--' are one line, exit 2, no usage dump, no worker."""
    if name == "env-command-variable":
        monkeypatch.setenv("CLUSTERDDP_NNODES", "x")
    code, err = _run([str(job) if a == "JOB" else a for a in argv], capsys)
    assert code == 2, err
    assert err.startswith("clusterddp: error: ") and err.count("\n") == 1, err
    fragments = (expected,) if isinstance(expected, str) else expected
    assert all(fragment in err for fragment in fragments) and "usage:" not in err, err
    assert not (job.parent / "logs").exists() and not (job.parent / "worker-started").exists()


@pytest.mark.parametrize("argv", [["render", "slurm", "JOB"], ["render", "k8s", "JOB"], ["render", "openpai", "JOB"],
                                  ["pack"]], ids=["render-slurm", "render-k8s", "render-openpai", "pack"])
@pytest.mark.parametrize("path", ["a\nb.out", "a\x1b[2Jb.out", ""], ids=["newline", "escape", "empty"])
def test_an_output_path_with_controls_is_refused_alike(job: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                                       path: str) -> None:
    """``-o`` of render (every scheduler) and of pack: one rule, one line ``COMMAND: -o: problem``, exit 2, nothing written."""
    before = sorted(job.parent.iterdir())
    code, err = _run([str(job) if a == "JOB" else a for a in argv] + ["-o", path], capsys)
    command = " ".join(a for a in argv if a != "JOB")
    assert code == 2, err
    assert err.startswith(f"clusterddp: error: {command}: -o: ") and err.count("\n") == 1, err
    assert validate.control_problem(err.rstrip("\n")) is None, repr(err)
    assert sorted(job.parent.iterdir()) == before


def test_bad_variable_does_not_break_version_or_help() -> None:
    """CLUSTERDDP_NNODES=x once broke even ``clusterddp --version``: variables are read only when used."""
    env = cli_env(CLUSTERDDP_NNODES="x", CLUSTERDDP_MASTER_PORT="nope")
    version = cli("--version", env=env)
    assert version.returncode == 0 and version.stdout.startswith("clusterddp "), version.stderr
    helped = cli("run", "--help", env=env)
    assert helped.returncode == 0 and "--master-port" in helped.stdout, helped.stderr


def test_flag_wins_over_a_bad_variable(job: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag given on the command line is used; the variable it would fall back to is not read."""
    monkeypatch.setenv("CLUSTERDDP_MASTER_PORT", "nope")
    code, err = _run(["run", str(job), "--master-port", "29533", "--dry-run"], capsys)
    assert code == 0, err


def test_the_worker_bound_can_be_raised(job: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """--nproc-per-node over 256 works in a dry run once CLUSTERDDP_MAX_WORKERS_PER_NODE allows it."""
    code, err = _run(["run", str(job), "--nproc-per-node", "300", "--dry-run"], capsys)
    assert code == 2 and "CLUSTERDDP_MAX_WORKERS_PER_NODE" in err
    monkeypatch.setenv("CLUSTERDDP_MAX_WORKERS_PER_NODE", "300")
    code, err = _run(["run", str(job), "--nproc-per-node", "300", "--dry-run"], capsys)
    assert code == 0, err


def test_large_dry_run_is_bounded(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 65,536-node dry run prints a bounded rank table (first nodes, this node, last), not 65,536 rows."""
    code = cli_module.main(["run", str(job), "--nnodes", "65536", "--node-rank", "40000",
                            "--master-addr", "10.0.0.1", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and len(out) < 10_000
    assert "40000-40000  <- this node" in out and "65535" in out and "(65536 nodes in all" in out


@pytest.mark.parametrize("argv,expected", [
    (["run", "JOB", "--master-port", "99999"], "--master-port: port must be 1-65535, got 99999"),
    (["run", "JOB", "--run-id", "../../x"], "--run-id: must be a run id"),
    (["run", "JOB", "--log-dir", "a-file"], "--log-dir: "),
    (["run", "--nproc-per-node", "1", "--", "missing.py"], "<command line>: script: no such file"),
    (["run", "JOB", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_real_cli_in_a_subprocess(job: Path, argv: list[str], expected: str) -> None:
    """Through ``python -m clusterddp``: rc 2, exactly one stderr line, no traceback, no logs, no worker."""
    result = cli(*[str(job) if a == "JOB" else a for a in argv], cwd=job.parent, timeout=600)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert not (job.parent / "logs").exists() and not (job.parent / "worker-started").exists()


def test_repository_jobs_still_dry_run() -> None:
    """The shipped example jobs pass every new rule (a dry run of each exits 0)."""
    for path in sorted((REPO / "jobs").glob("*.yaml")):
        result = cli("run", str(path), "--dry-run", "--nproc-per-node", "1", timeout=600)
        assert result.returncode == 0, (path, result.stderr)


def test_environment_too_large_for_exec_is_one_line_before_anything(tmp_path: Path) -> None:
    """argv + environment over the kernel's limit (E2BIG at exec) is a LaunchError naming env, before logs exist."""
    from clusterddp.errors import LaunchError
    from clusterddp.launch.start import plan as planning
    from clusterddp.spec import load_job
    from clusterddp.topology import Topology

    script = tmp_path / "w.py"
    script.write_text("")
    path = tmp_path / "job.yaml"
    values = ", ".join(f"V{i}: {'x' * 60000}" for i in range(16))
    path.write_text(f"script: {script}\nnproc_per_node: 1\nlogs: {{dir: {tmp_path / 'logs'}}}\nenv: {{{values}}}\n")
    job = load_job(path)
    topology = Topology(env="local", nnodes=1, node_rank=0, nproc_per_node=1, master_addr="127.0.0.1",
                        master_port=29500, run_id="r", backend="gloo", host="h")
    base = {"PATH": os.environ["PATH"], **{f"BIG{i}": "y" * 100_000 for i in range(12)}}
    plans = planning.worker_plans(job, topology, base, str(tmp_path))
    with pytest.raises(LaunchError) as info:
        planning.check_runnable(job, plans)
    assert str(info.value).startswith(f"{path}:4: env: the worker cannot be started: arguments and environment take")
    assert not (tmp_path / "logs").exists()


# --- Properties: any text as a hostfile, any string in any flag.

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from clusterddp import validate  # noqa: E402
from clusterddp.errors import ClusterDDPError, HostlistError  # noqa: E402
from clusterddp.hostfile import parse_hostfile  # noqa: E402

_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                              HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(st.text(max_size=300))
def test_any_hostfile_text_is_hosts_or_one_line(text: str) -> None:
    """Arbitrary hostfile text gives entries with clean host names, or one HostlistError naming hosts.txt:line."""
    try:
        entries = parse_hostfile(text, "hosts.txt")
    except HostlistError as exc:
        assert str(exc).startswith("hosts.txt:") and validate.control_problem(str(exc)) is None, repr(str(exc))
        return
    for entry in entries:
        assert validate.control_problem(entry.host) is None and not entry.host.startswith("-")
        assert entry.slots is None or 1 <= entry.slots <= validate.MAX_WORKERS_PER_NODE


_FLAGS = ["--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--run-id",
          "--restarts", "--grace-period", "--log-ranks", "--keepalive-timeout"]


@_SETTINGS
@given(st.sampled_from(_FLAGS), st.text(max_size=40) | st.sampled_from(["1e999", "nan", "-0", "99999999999999999999"]))
def test_any_flag_value_is_used_or_one_line(job: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                            value: str) -> None:
    """Any string in any placement or supervision flag: a dry run (exit 0) or one error line (exit 2), never a traceback."""
    try:
        code = cli_module.main(["run", str(job), f"{flag}={value}", "--dry-run"])
    except ClusterDDPError:  # pragma: no cover - main catches these; reaching here is the failure
        raise
    err = capsys.readouterr().err
    assert code in (0, 2), (code, err)
    if code == 2:
        assert err.startswith("clusterddp: error: ") and err.count("\n") == 1, err
    assert not (job.parent / "logs").exists()


def test_dry_run_runs_no_match_exec_of_the_ssh_config(tmp_path: Path) -> None:
    """An ssh_config 'Match exec' is a command of the user's: --dry-run refuses it (one line, exit 2) and runs it not."""
    canary = tmp_path / "match-exec-ran"
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  ConnectTimeout 2\n\nMatch exec \"touch {canary}\"\n  Port 2222\n")
    (tmp_path / "t.py").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text(f"script: t.py\nssh:\n  hosts: [127.0.0.1]\n  config_file: {config}\n  connect_timeout: 2\n")
    result = cli("run", str(job), "--dry-run", cwd=tmp_path, timeout=600)
    assert not canary.exists()
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"clusterddp: error: {config}:4: Match exec "), result.stderr
