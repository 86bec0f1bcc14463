"""The ``clusterddp`` command: parse, build a config, hand over. No logic lives here.

Every user error (a ``ClusterDDPError``) becomes one line on stderr and a non-zero exit, never
a traceback. Flags fall back to ``CLUSTERDDP_<FLAG>`` environment variables.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from dataclasses import asdict, fields, replace
import typing
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from clusterddp import __version__, validate
from clusterddp.affinity import MODES as AFFINITY_MODES
from clusterddp.errors import ClusterDDPError

from clusterddp.schedulers import ACTIONS as SCHEDULER_ACTIONS
from clusterddp.schedulers import SCHEDULERS

if TYPE_CHECKING:  # imported lazily at run time: `clusterddp --help` should not pay for YAML
    from clusterddp.schedulers.api import Scheduler
    from clusterddp.spec import JobSpec

_Options = TypeVar("_Options")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m clusterddp``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except ClusterDDPError as exc:
        from clusterddp.redact import scrub  # every secret read so far is masked in the one line

        lines = [f"clusterddp: error: {validate.escape_controls(scrub(str(exc)))}"]
        lines.extend(f"  {validate.escape_controls(scrub(detail))}" for detail in exc.details)
        print("\n".join(lines), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("clusterddp: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # `clusterddp render ... | head`: the reader left; stop quietly like other CLI tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _dispatch(argv: list[str]) -> int:
    command, extra = _split_command(argv)
    parser = build_parser()
    if len(argv) >= 1 and argv[0] in SCHEDULER_ACTIONS:
        # `clusterddp submit slurm JOB ...`: the scheduler's own flags follow its name.
        args, _ = parser.parse_known_args(argv[:2])
        from clusterddp.schedulers import get_scheduler

        options = scheduler_options(args.command, args.scheduler, argv[2:])
        return int(get_scheduler(args.scheduler).main(options))
    args = parser.parse_args(command)
    if args.command is None:
        parser.print_help()
        return 2
    args = _typed(args, os.environ)
    args.script_command = extra
    if args.command == "run":
        return _run(args)
    if args.command == "env":
        return _env(args)
    if args.command == "stacks":
        from clusterddp.diagnose.request import StacksOptions, stacks_main

        return stacks_main(options_from(StacksOptions, args))
    if args.command == "pack":
        return _pack(args.output)
    if args.command == "doctor":
        from clusterddp.launch.doctor import DoctorOptions, doctor_main

        return doctor_main(args.job, options_from(DoctorOptions, args))
    parser.error(f"unknown command {args.command}")
    return 2


def _pack(output: str | None) -> int:
    """Write the launcher's zipapp and say how a container runs it."""
    from clusterddp import pack

    path = output or pack.default_output()
    problem = validate.path_problem(path)
    if problem:
        raise ClusterDDPError(f"pack: -o: {problem}")
    try:
        size = pack.build(path)
    except OSError as exc:
        raise ClusterDDPError(f"pack: cannot write {validate.shown(path)}: {exc.strerror}") from None
    print(f"wrote {path} ({size} bytes): run it with any python3 >= 3.9 as 'python3 {path} run JOB'")
    return 0


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``run [flags] -- train.py --lr 0.1``: what follows ``--`` is the worker's command."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


class _Parser(argparse.ArgumentParser):
    """argparse whose own errors (unknown flag, missing value) are one ClusterDDPError line,
    exit 2, like every other bad input; ``--help`` and ``--version`` still print and exit 0."""

    def error(self, message: str) -> typing.NoReturn:
        where = self.prog.removeprefix("clusterddp").strip() or "clusterddp"
        message = message.removeprefix("argument ")
        raise ClusterDDPError(f"{where}: {validate.escape_controls(message)[:300]}", f"see '{self.prog} --help'")


class _Problem(ValueError):
    """A flag or variable value that breaks its rule; the message is the rule's problem."""


def _integer(raw: str) -> int:
    if not validate.INTEGER_TEXT.fullmatch(raw):
        raise _Problem(f"expected an integer, got {validate.shown(raw)}")
    return int(raw)


def _number(raw: str) -> float:
    if not _FLOAT.fullmatch(raw):
        raise _Problem(f"expected a number, got {validate.shown(raw)}")
    return float(raw)


_FLOAT = re.compile(r"-?(?:[0-9]{1,12}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})(?:[eE][-+]?[0-9]{1,3})?")


def _checked(parse: Callable[[str], Any], *problems: Callable[[Any], str | None]) -> Callable[[str], Any]:
    """A converter: parse the text, then apply the same rules as the job-file key."""
    def convert(raw: str) -> Any:
        value = parse(raw)
        for problem_of in problems:
            problem = problem_of(value)
            if problem:
                raise _Problem(problem)
        return value
    return convert


def _nproc_value(raw: str) -> int | str:
    if raw in ("auto", "gpu", "cpu"):
        return raw
    if not validate.INTEGER_TEXT.fullmatch(raw):
        raise _Problem(f"expected a number, 'auto', 'gpu' or 'cpu', got {validate.shown(raw)}")
    return int(_checked(int, validate.workers_problem)(raw))


def _ranks(raw: str) -> frozenset[int]:
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    if len(parts) > 4096 or not all(validate.INTEGER_TEXT.fullmatch(p) and int(p) >= 0 for p in parts):
        raise _Problem(f"expected ranks like 0,3, got {validate.shown(raw)}")
    return frozenset(int(p) for p in parts)


def _node_workers(raw: str) -> tuple[int, ...]:
    """``--workers-per-node 2,1,1``: every node's worker count, in node-rank order."""
    parts = raw.split(",")
    if len(parts) > validate.MAX_NODES or not all(validate.INTEGER_TEXT.fullmatch(p) for p in parts):
        raise _Problem(f"expected worker counts like 2,1,1, got {validate.shown(raw)}")
    counts = tuple(int(p) for p in parts)
    for count in counts:
        problem = validate.workers_problem(count)
        if problem:
            raise _Problem(problem)
    return counts


def _text(problem_of: Callable[[str], str | None]) -> Callable[[str], str]:
    return _checked(str, problem_of)


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def convert(raw: str) -> str:
        if raw in options:
            return raw
        raise _Problem(f"expected one of {', '.join(options)}, got {validate.shown(raw)}")
    return convert


def _sizes(raw: str) -> tuple[int, ...] | None:
    problem = validate.line_problem(raw)
    if problem:
        raise _Problem(problem)
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    if not all(validate.INTEGER_TEXT.fullmatch(part) for part in parts):
        raise _Problem(f"expected sizes in bytes like 8,65536, got {validate.shown(raw)}")
    return tuple(int(part) for part in parts) or None


def _node_rank(value: int) -> str | None:
    return None if 0 <= value < validate.MAX_NODES else f"must be 0-{validate.MAX_NODES - 1}, got {value}"


def _fraction(value: float) -> str | None:
    return None if 0 < value <= 1 else f"must be > 0 and <= 1, got {value}"


def _run_id(value: str) -> str | None:
    return validate.token_problem(value, "a run id")


#: Every flag that takes a value: its converter, which applies the same validators as the
#: job-file key it overrides, and the CLUSTERDDP_* variable it falls back to (if any).
FLAGS: dict[str, tuple[str, Callable[[str], Any], str | None]] = {
    "nproc_per_node": ("--nproc-per-node", _nproc_value, "CLUSTERDDP_NPROC_PER_NODE"),
    "nnodes": ("--nnodes", _checked(_integer, validate.nodes_problem), "CLUSTERDDP_NNODES"),
    "node_rank": ("--node-rank", _checked(_integer, _node_rank), "CLUSTERDDP_NODE_RANK"),
    "master_addr": ("--master-addr", _text(validate.host_problem), "CLUSTERDDP_MASTER_ADDR"),
    "master_port": ("--master-port", _checked(_integer, validate.port_problem), "CLUSTERDDP_MASTER_PORT"),
    "run_id": ("--run-id", _text(_run_id), "CLUSTERDDP_RUN_ID"),
    "hostfile": ("--hostfile", _text(validate.path_problem), "CLUSTERDDP_HOSTFILE"),
    "restarts": ("--restarts", _checked(_integer, validate.non_negative_problem), "CLUSTERDDP_RESTARTS"),
    "restart_count": ("--restart-count", _checked(_integer, validate.non_negative_problem),
                      "CLUSTERDDP_RESTART_COUNT"),
    "workers_per_node": ("--workers-per-node", _node_workers, None),
    "grace_period": ("--grace-period", _checked(_number, validate.seconds_problem), "CLUSTERDDP_GRACE_PERIOD"),
    "python": ("--python", _text(validate.path_problem), "CLUSTERDDP_PYTHON"),
    "log_dir": ("--log-dir", _text(validate.path_problem), "CLUSTERDDP_LOG_DIR"),
    "log_ranks": ("--log-ranks", _ranks, "CLUSTERDDP_LOG_RANKS"),
    "cpu_affinity": ("--cpu-affinity", _choice(AFFINITY_MODES), "CLUSTERDDP_CPU_AFFINITY"),
    "heartbeat_timeout": ("--heartbeat-timeout", _checked(_number, validate.positive_seconds_problem), None),
    "timeout": ("--timeout", _checked(_number, validate.positive_seconds_problem), None),
    "iters": ("--iters", _checked(_integer, validate.workers_problem), None),
    "partners": ("--partners", _checked(_integer, validate.nodes_problem), None),
    "slow_fraction": ("--slow-fraction", _checked(_number, _fraction), None),
    "sizes": ("--sizes", _sizes, None),
    "job": ("JOB", _text(validate.path_problem), None),
    "target": ("TARGET", _text(validate.path_problem), None),
}
#: Lists of values (repeatable flags): each item passes the rule.
LIST_FLAGS = {"include": "--include", "exclude": "--exclude"}


def _typed(args: argparse.Namespace, env: Mapping[str, str]) -> argparse.Namespace:
    """Convert and validate every flag (as typed) and every CLUSTERDDP_* fallback (as set).

    Defaults are never computed from the environment while the parser is built, so a bad
    ``CLUSTERDDP_NNODES`` cannot break ``--help`` or ``--version``; it fails here, naming the
    variable, only for the commands that read it."""
    for dest, (flag, convert, variable) in FLAGS.items():
        if not hasattr(args, dest):
            continue
        raw, where = getattr(args, dest), flag
        if raw is None and variable and env.get(variable, "") != "":
            raw, where = env[variable], variable
        if raw is None or not isinstance(raw, str):
            continue
        try:
            setattr(args, dest, convert(raw))
        except _Problem as exc:
            raise ClusterDDPError(f"{where}: {exc}") from None
    for dest, flag in LIST_FLAGS.items():
        for raw in getattr(args, dest, None) or ():
            problem = validate.path_problem(raw)
            if problem:
                raise ClusterDDPError(f"{flag}: {problem}")
    limit = env.get(validate.MAX_WORKERS_ENV, "")
    if limit and validate.int_text_problem(limit, 1, 1 << 20):
        raise ClusterDDPError(f"{validate.MAX_WORKERS_ENV}: {validate.int_text_problem(limit, 1, 1 << 20)}")
    return args


def _add_placement_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("placement (override the detected cluster environment)")
    group.add_argument("--nproc-per-node", help="workers on this node: a number, auto, gpu or cpu")
    group.add_argument("--nnodes")
    group.add_argument("--node-rank")
    group.add_argument("--master-addr")
    group.add_argument("--master-port")
    group.add_argument("--run-id", help="names the log dir and seeds the derived master port")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="clusterddp",
        description="Run one PyTorch DDP job file here, over SSH, on SLURM or on OpenPAI.")
    parser.add_argument("--version", action="version", version=f"clusterddp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="start the job's workers on this node (or on every host of a hostfile)",
                         description="Start the job. 'clusterddp run --nproc-per-node 2 -- train.py --lr 0.1' "
                                     "runs a script without a job file, like torchrun.")
    run.add_argument("job", nargs="?", help="job file (jobs/*.yaml)")
    run.add_argument("--job-dir", metavar="DIR", help="where the job file's relative paths start (default: its "
                     "directory; a Kubernetes pod's job file comes from a ConfigMap)")
    _add_placement_flags(run)
    ssh = run.add_argument_group("SSH fan-out")
    ssh.add_argument("--hostfile",
                     help="hosts to fan out to: 'host', 'host slots=N' or 'host:N' per line")
    ssh.add_argument("--include", action="append", default=[], help="only these hosts (repeatable)")
    ssh.add_argument("--exclude", action="append", default=[], help="not these hosts (repeatable)")
    opts = run.add_argument_group("supervision and logs")
    opts.add_argument("--dry-run", action="store_true", help="print ranks, commands and env; start nothing")
    opts.add_argument("--restarts", help="restart the local group up to N times")
    opts.add_argument("--grace-period", help="seconds between SIGTERM and SIGKILL at teardown")
    opts.add_argument("--python", help="interpreter for the workers (default: this one)")
    opts.add_argument("--log-dir", help="per-rank log files go to DIR/<run-id>/")
    opts.add_argument("--log-ranks", help="show only these ranks on the console, e.g. 0,1")
    opts.add_argument("--no-prefix", action="store_true", help="no [host rank R] prefix on console lines")
    gpu = run.add_argument_group("devices")
    gpu.add_argument("--cpu-affinity", help="CPUs of each worker: " + ", ".join(AFFINITY_MODES)
                     + " (default auto: the cores of its GPU's NUMA node, or a disjoint share)")
    gpu.add_argument("--virtual-local-rank", action="store_true",
                     help="each worker sees only its own GPU, as device 0, with LOCAL_RANK=0 (as torchrun)")
    internal = run.add_argument_group("used by the SSH head on remote hosts")
    internal.add_argument("--watch-stdin", action="store_true",
                          help="stop the workers when stdin closes or its heartbeat stops")
    internal.add_argument("--heartbeat-timeout", default="6.0")
    internal.add_argument("--report-json", action="store_true", help="print a CLUSTERDDP_RESULT line at the end")
    internal.add_argument("--restart-count", metavar="K",
                          help="this start is attempt K of a job restarted as a whole (by the SSH head or "
                               "the batch script): no restarts of this node alone")
    internal.add_argument("--workers-per-node", metavar="N,N,...",
                          help="every node's workers in node-rank order; ranks are their prefix sums")

    env = sub.add_parser("env", help="show the detected cluster environment and the topology it gives")
    env.add_argument("job", nargs="?", help="job file (for nproc_per_node, master)")
    env.add_argument("--json", action="store_true", help="machine-readable output")
    _add_placement_flags(env)

    _add_tool_commands(sub)
    _add_scheduler_commands(sub)
    return parser


def _add_tool_commands(sub: Any) -> None:
    """``stacks`` and ``doctor``: the diagnostics beside ``run``."""
    stacks = sub.add_parser("stacks", help="dump every worker's Python stack of a running job")
    stacks.add_argument("target", nargs="?", help="run id or log directory (default: the newest run)")
    stacks.add_argument("--log-dir", default="logs")
    stacks.add_argument("--timeout", default="10.0")

    pack = sub.add_parser("pack", help="write the launcher as one file (a zipapp) that any python3 runs")
    pack.add_argument("-o", "--output", help="the file to write (default clusterddp-VERSION.pyz)")

    doctor = sub.add_parser("doctor", help="preflight every node and measure all_reduce across them")
    doctor.add_argument("job")
    doctor.add_argument("--hostfile")
    doctor.add_argument("--sizes", help="message sizes in bytes, comma-separated (default 8,65536,1048576)")
    doctor.add_argument("--iters", help="timed iterations per size (default 5; x4 for sizes <= 4 KiB)")
    doctor.add_argument("--partners", help="partner nodes per node for the ping-pong (default 3)")
    doctor.add_argument("--slow-fraction",
                        help="flag a node below this fraction of the others' median (default 0.5)")


def _add_scheduler_commands(sub: Any) -> None:
    """``clusterddp ACTION SCHEDULER ...``: the scheduler's own flags are parsed later, from its
    ``Flag`` rows (``scheduler_options``), so only its name is read here."""
    names = list(SCHEDULERS)
    for action in SCHEDULER_ACTIONS:
        what = "follow the job's logs" if action == "logs" else f"{action} the job"
        p = sub.add_parser(action, help=f"{what} on a scheduler ({', '.join(names)})", add_help=False)
        p.add_argument("scheduler", help=" or ".join(names))


class _SchedulerParser(argparse.ArgumentParser):
    """A scheduler's flags: a usage mistake is one ``clusterddp: error: clusterddp ACTION
    SCHEDULER: ...`` line and exit 2 instead of argparse's usage block."""

    def error(self, message: str) -> typing.NoReturn:
        raise ClusterDDPError(f"{self.prog}: {message}", f"see '{self.prog} --help'")


def scheduler_options(action: str, name: str, argv: Sequence[str]) -> Any:
    """``clusterddp ACTION SCHEDULER ...``: the scheduler's flags, parsed here, as its options.

    An unknown scheduler, then an action it does not have, is refused before any flag is read.
    """
    from clusterddp.schedulers import get_scheduler

    scheduler = get_scheduler(name)
    scheduler.check_action(action)
    return scheduler.options(action, vars(scheduler_parser(scheduler, action).parse_args(argv)))


def scheduler_parser(scheduler: Scheduler[Any], action: str) -> argparse.ArgumentParser:
    """The parser of ``clusterddp ACTION SCHEDULER``, built from the scheduler's ``Flag`` rows:
    the scheduler declares its flags as data and never sees argparse."""
    parser = _SchedulerParser(prog=f"clusterddp {action} {scheduler.name}",
                              description=scheduler.descriptions.get(action))
    for flag in scheduler.flags_for(action):
        settings: dict[str, Any] = {"help": flag.help}
        if flag.switch:
            settings["action"] = "store_true"
        elif flag.convert is not None:
            settings["type"] = flag.convert
        if flag.default is not None:
            settings["default"] = flag.default
        if flag.metavar is not None:
            settings["metavar"] = flag.metavar
        if flag.names:
            settings["dest"] = flag.dest
        parser.add_argument(*(flag.names or (flag.dest,)), **settings)
    return parser


def _load(args: argparse.Namespace) -> JobSpec:
    from clusterddp.spec import job_from_command, load_job

    if args.job and args.script_command:
        raise ClusterDDPError("give a job file or a command after '--', not both")
    job_dir = getattr(args, "job_dir", None)
    if job_dir is not None and (not args.job or getattr(args, "hostfile", None)):
        raise ClusterDDPError("--job-dir needs a job file and runs one node (the SSH fan-out sends the file's own path)")
    job = load_job(args.job, job_dir) if args.job else job_from_command(args.script_command)
    changes: dict[str, object] = {"nproc_per_node": args.nproc_per_node}
    for name in ("restarts", "grace_period", "python", "cpu_affinity"):
        changes[name] = getattr(args, name, None)
    changes["virtual_local_rank"] = True if getattr(args, "virtual_local_rank", False) else None
    flags = {name: flag for name, (flag, _, _) in FLAGS.items()} | {"virtual_local_rank": "--virtual-local-rank"}
    given = {key: flags[key] for key, value in changes.items() if value is not None}
    logs = job.logs
    if getattr(args, "log_dir", None):
        logs = replace(logs, dir=args.log_dir)
        given["logs.dir"] = "--log-dir"
    if getattr(args, "log_ranks", None) is not None:
        logs = replace(logs, ranks=tuple(sorted(args.log_ranks)))
    if getattr(args, "no_prefix", False):
        logs = replace(logs, prefix=False)
    return job.with_overrides(logs=logs, given_by=given, **changes)


def options_from(cls: type[_Options], args: argparse.Namespace, **values: Any) -> _Options:
    """The typed options ``cls`` of a library entry point, from the flags it has (as ``_typed``
    converted them); a flag not given leaves the dataclass's default."""
    for item in fields(cls):  # type: ignore[arg-type]
        value = getattr(args, item.name, None)
        if value is not None and item.name not in values:
            values[item.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def _run(args: argparse.Namespace) -> int:
    from clusterddp.launch.run import RunOptions, run_job

    job = _load(args)
    return run_job(job, options_from(RunOptions, args), dict(os.environ))


def _env(args: argparse.Namespace) -> int:
    from clusterddp.envs import detect, known_environments
    from clusterddp.launch.run import RunOptions
    from clusterddp.spec import JobSpec
    from clusterddp.topology import resolve

    args.script_command = []
    job = _load(args) if args.job else JobSpec(name="env", script="-", nproc_per_node=args.nproc_per_node or "auto")
    environment = detect(dict(os.environ), options_from(RunOptions, args).overrides(job if args.job else None))
    placement = environment.placement()
    topology = resolve(job, placement, dict(os.environ), master_port=args.master_port, nnodes=args.nnodes)
    if args.json:
        data = asdict(topology)
        data["world_size"] = topology.world_size
        data["hosts"] = list(topology.hosts)
        data["notes"] = list(topology.notes)
        print(json.dumps(data, indent=2))
        return 0
    print(f"environment: {topology.env}")
    for key in ("nnodes", "node_rank", "nproc_per_node", "world_size", "master_addr", "master_port",
                "run_id", "backend", "host"):
        print(f"  {key:15s} {getattr(topology, key)}")
    if topology.hosts:
        print(f"  {'hosts':15s} {','.join(topology.hosts)}")
    for note in topology.notes:
        print(f"  note: {note}")
    print("known environments, in detection order:")
    print(known_environments())
    return 0


if __name__ == "__main__":
    sys.exit(main())
