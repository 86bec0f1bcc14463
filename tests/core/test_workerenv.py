"""One writer of each worker's environment (launch/start/workerenv.py), checked on the source and on
real workers: every attempt gets what the dry run prints, with its own TORCHELASTIC_RESTART_COUNT."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from clusterddp.launch.start.workerenv import WorkerEnv
from clusterddp.protocol import HEARTBEAT_FILE_ENV, STACKS_FILE_ENV, SUPERVISOR_ID_ENV
from clusterddp.topology import Topology
from tests.conftest import REPO, cli, cli_env, write_job

PACKAGE = REPO / "clusterddp"
WRITER = PACKAGE / "launch" / "start" / "workerenv.py"
#: Every variable the writer can set: a build with every optional input given.
_TOPOLOGY = Topology(env="local", nnodes=1, node_rank=0, nproc_per_node=1, master_addr="127.0.0.1",
                     master_port=29500, run_id="r", backend="gloo", host="h")
WORKER_VARIABLES = set(WorkerEnv(_TOPOLOGY, 0, error_file="e", stacks_file="s", heartbeat_file="h",
                                 device="0").build(0, marker="m"))
#: The protocol's constants that name a worker variable.
VARIABLE_CONSTANTS = {"STACKS_FILE_ENV": STACKS_FILE_ENV, "HEARTBEAT_FILE_ENV": HEARTBEAT_FILE_ENV,
                      "SUPERVISOR_ID_ENV": SUPERVISOR_ID_ENV}


def _variable(node: ast.expr | None) -> str | None:
    """The worker variable an expression names (a string literal or a protocol constant)."""
    if isinstance(node, ast.Constant) and node.value in WORKER_VARIABLES:
        return str(node.value)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return VARIABLE_CONSTANTS.get(name) if name else None


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, variable) of each store of a worker variable: ``x[NAME] = ...``, a dict display
    with NAME as a key, ``x.setdefault(NAME, ...)``, ``x.update(NAME=...)`` or ``dict(NAME=...)``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        keys: list[ast.expr | None] = []
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            keys = [t.slice for t in targets if isinstance(t, ast.Subscript)]
        elif isinstance(node, ast.Dict):
            keys = list(node.keys)
        elif isinstance(node, ast.Call):
            method = node.func.attr if isinstance(node.func, ast.Attribute) else \
                node.func.id if isinstance(node.func, ast.Name) else ""
            if method == "setdefault" and node.args:
                keys = [node.args[0]]
            if method in ("update", "dict"):
                found += [(node.lineno, k.arg) for k in node.keywords if k.arg in WORKER_VARIABLES]
        found += [(node.lineno, v) for v in map(_variable, keys) if v is not None]
    return found


def _launcher_sources() -> list[Path]:
    """The modules a local ``run`` passes through on its way to a worker (not the SSH head's
    launch/ssh/, which builds a remote launcher's environment, nor train/, the worker's side)."""
    launch = [path for path in (PACKAGE / "launch").rglob("*.py") if "ssh" not in path.relative_to(PACKAGE).parts]
    return sorted([*PACKAGE.glob("*.py"), *launch, *(PACKAGE / "envs").glob("*.py")])


def test_only_workerenv_writes_a_worker_variable() -> None:
    """No module of the local run path but launch/start/workerenv.py stores a variable a worker gets."""
    problems = [f"{path.relative_to(REPO)}:{line}: writes {name}"
                for path in _launcher_sources() if path != WRITER
                for line, name in _writes(ast.parse(path.read_text(), str(path)))]
    assert problems == []


def _function(path: Path, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text(), str(path))
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_the_worker_group_passes_the_built_environment_to_exec_untouched() -> None:
    """WorkerGroup.start_all hands procs.spawn and the warm start exactly what plan.env.build(attempt, marker) returned."""
    start = _function(PACKAGE / "launch" / "start" / "workers.py", "WorkerGroup", "start_all")
    assigned = [ast.unparse(n.value) for n in ast.walk(start) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "envs" for t in n.targets)]
    assert assigned == ["[plan.env.build(attempt, self.marker) for plan in plans]"]
    spawn = next(n for n in ast.walk(start) if isinstance(n, ast.Call) and ast.unparse(n.func) == "procs.spawn")
    env = spawn.args[1]
    assert isinstance(env, ast.Name), ast.unparse(spawn)
    loop = next(n for n in ast.walk(start) if isinstance(n, ast.For)
                and env.id in {x.id for x in ast.walk(n.target) if isinstance(x, ast.Name)})
    assert ast.unparse(loop.iter).startswith("zip(plans, envs"), ast.unparse(loop.iter)
    warm = next(n for n in ast.walk(start) if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.warm.spawn_all")
    assert ast.unparse(warm.args[0]) == "list(zip(plans, envs))"
    changed = [ast.unparse(n) for n in ast.walk(start)
               if isinstance(n, ast.Subscript) and ast.unparse(n.value) in (env.id, "envs")
               or isinstance(n, ast.Call) and ast.unparse(n.func).startswith((f"{env.id}.", "envs."))]
    assert changed == []


def test_the_supervisor_passes_the_attempt_number_through() -> None:
    """The supervisor's start path builds no environment: it gives the group its plans and the attempt."""
    start = _function(PACKAGE / "launch" / "supervise" / "attempt.py", "AttemptRun", "start")
    starts = [ast.unparse(n) for n in ast.walk(start) if isinstance(n, ast.Call)
              and ast.unparse(n.func) in ("self.group.start", "self.group.start_all")]
    assert starts == ["self.group.start_all(plans, attempt)"]
    assert _writes(start) == []


def _dry_run_envs(text: str) -> dict[str, dict[str, str]]:
    """Each rank's ``  KEY=VALUE`` lines of a dry run, by rank."""
    envs: dict[str, dict[str, str]] = {}
    rank = ""
    for line in text.splitlines():
        if line.startswith("rank "):
            rank = line.split()[1]
            envs[rank] = {}
        elif rank and line.startswith("  ") and "=" in line and not line.startswith(("  argv:", "  log:", "  cpus:")):
            key, _, value = line.strip().partition("=")
            envs[rank][key] = value
    return envs


def _attempts(tmp_path: Path, *flags: str, restarts: int, fail_below: int) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Run a 2-worker job whose workers record their env and fail on attempts below ``fail_below``;
    the launcher's environment and the dry run's worker env of each rank."""
    job = write_job(tmp_path, script="record_attempts.py", args=[str(tmp_path), str(fail_below)],
                    restarts=restarts, cpu_affinity="none")
    env = cli_env()
    flags = ("--run-id", "r", "--master-port", "29533", *flags)
    dry = cli("run", str(job), *flags, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    done = cli("run", str(job), *flags, env=env)
    assert done.returncode == 0, done.stderr
    return env, _dry_run_envs(dry.stdout)


def _recorded(tmp_path: Path, rank: str, attempt: int) -> dict[str, str]:
    env: dict[str, str] = json.loads((tmp_path / f"rank{rank}.attempt{attempt}.json").read_text())
    return env


def test_every_attempt_gets_the_dry_runs_env_with_its_restart_count(tmp_path: Path) -> None:
    """restarts: 2, workers failing on attempts 0 and 1: each attempt's env is exactly the dry run's,
    TORCHELASTIC_RESTART_COUNT 0, 1, 2, plus the launcher's marker."""
    launcher, planned = _attempts(tmp_path, restarts=2, fail_below=2)
    assert sorted(planned) == ["0", "1"]
    for rank, variables in planned.items():
        assert variables["TORCHELASTIC_RESTART_COUNT"] == "0"
        for attempt in range(3):
            got = _recorded(tmp_path, rank, attempt)
            marker = got.pop(SUPERVISOR_ID_ENV)
            assert got == {**launcher, **variables, "TORCHELASTIC_RESTART_COUNT": str(attempt)}
            assert marker == _recorded(tmp_path, "0", 0)[SUPERVISOR_ID_ENV]  # one launcher, one marker
    assert not list(tmp_path.glob("rank*.attempt3.json"))


def test_a_restart_from_outside_counts_from_its_attempt(tmp_path: Path) -> None:
    """--restart-count 2 (the SSH head's or a scheduler's retry): the workers' first start is
    attempt 2, as the dry run says, and this node restarts nothing alone."""
    launcher, planned = _attempts(tmp_path, "--restart-count", "2", restarts=3, fail_below=0)
    for rank, variables in planned.items():
        assert variables["TORCHELASTIC_RESTART_COUNT"] == "2"
        got = _recorded(tmp_path, rank, 2)
        got.pop(SUPERVISOR_ID_ENV)
        assert got == {**launcher, **variables}
    assert sorted(p.name for p in tmp_path.glob("rank*.attempt*.json")) == ["rank0.attempt2.json", "rank1.attempt2.json"]
