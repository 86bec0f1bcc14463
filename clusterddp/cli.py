"""The ``clusterddp`` command: parse, build a config, hand over. No logic lives here.

Every user error (a ``ClusterDDPError``) becomes one line on stderr and a non-zero exit, never
a traceback. Flags fall back to ``CLUSTERDDP_<FLAG>`` environment variables.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import asdict, fields
import typing
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from clusterddp import __version__, earlystop, validate
from clusterddp.errors import ClusterDDPError
from clusterddp.launch import flags

from clusterddp.schedulers import ACTIONS as SCHEDULER_ACTIONS
from clusterddp.schedulers import SCHEDULERS

if TYPE_CHECKING:  # imported lazily at run time: `clusterddp --help` should not pay for YAML
    from clusterddp.launch.options import RunOptions
    from clusterddp.schedulers.api import Scheduler
    from clusterddp.spec import JobSpec

_Options = TypeVar("_Options")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m clusterddp``."""
    try:
        if argv is None:  # the process's own command (not a call from Python): see earlystop
            earlystop.install()
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except earlystop.StoppedEarly as exc:  # what it started was cleaned up on the way here
        print(f"clusterddp: stopped by {exc.name}", file=sys.stderr)
        return 128 + exc.signum
    except ClusterDDPError as exc:
        from clusterddp.redact import scrub  # every secret read so far is masked in the one line

        # One bounded line each: a message that quotes a 5,000-character argument (or a tool's
        # answer to it) is cut, whichever path built it.
        lines = [f"clusterddp: error: {validate.clip(scrub(str(exc)), validate.MAX_ERROR_CHARS)}"]
        lines.extend(f"  {validate.clip(scrub(detail), validate.MAX_ERROR_CHARS)}" for detail in exc.details)
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
    if len(argv) >= 2 and argv[0] in RUN_ACTIONS and argv[1] not in SCHEDULERS and argv[1] not in ("-h", "--help"):
        return _by_run_id(argv[0], argv[1:])  # `clusterddp stop RUN`: any target, by its run id
    if len(argv) >= 1 and argv[0] in SCHEDULER_ACTIONS:
        # `clusterddp submit slurm JOB ...`: the scheduler's own flags follow its name.
        args, _ = parser.parse_known_args(argv[:2])
        from clusterddp.schedulers import get_scheduler

        options = scheduler_options(args.command, args.scheduler, argv[2:])
        scheduler = get_scheduler(args.scheduler)
        code = int(scheduler.main(options))
        if scheduler.submitted is not None:
            _record_submit(scheduler, options)
        return code
    args = parser.parse_args(command)
    if args.command is None:
        parser.print_help()
        return 2
    args = _typed(args, os.environ)
    args.script_command = extra
    args.argv = argv
    if args.command == "run":
        return _run(args)
    if args.command == "env":
        return _env(args)
    if args.command == "stacks":
        from clusterddp.diagnose.request import StacksOptions, stacks_main

        return stacks_main(options_from(StacksOptions, args))
    if args.command == "report":
        from clusterddp.diagnose.goodput import ReportOptions, report_main

        return report_main(options_from(ReportOptions, args))
    if args.command == "attach":
        from clusterddp.registry import detach, store

        record = store.find(args.run)
        if record.head:  # a detached SSH run: its console is on its head's host
            from clusterddp.launch import remotehead

            return remotehead.attach(record)
        return detach.attach(record)
    if args.command == "ls":
        return _ls(args.json, args.refresh)
    if args.command == "pack":
        return _pack(args.output)
    if args.command == "doctor":
        from clusterddp.launch.doctor import DoctorOptions, doctor_main

        return doctor_main(args.job, options_from(DoctorOptions, args))
    parser.error(f"unknown command {args.command}")
    return 2


#: The actions that also take a run id from the registry instead of a scheduler's name.
RUN_ACTIONS = ("status", "stop", "logs")


def _ls(as_json: bool, refresh: bool) -> int:
    """``clusterddp ls``: every record, checked where cheap; each scheduler asked once for all
    its runs still going (``--refresh``: for all its runs)."""
    from clusterddp.registry import store, view

    records, problems = store.load_all()
    for problem in problems:
        print(f"clusterddp: warning: {validate.clip(problem, 300)}", file=sys.stderr)
    rows = [view.live(record, _goodput) for record in records]
    heads = [row.record for row in rows if row.record.head and (refresh or row.state not in store.FINAL)]
    if heads:  # detached SSH runs: each head's host asked once, for all its runs
        from clusterddp.launch import remotehead

        view.merge(rows, remotehead.refresh(heads))
    for name in SCHEDULERS:  # one question per platform, for all its runs at once
        asked = [row.record for row in rows if row.record.target == name and (refresh or row.state not in store.FINAL)]
        if asked:
            from clusterddp.schedulers import get_scheduler

            view.merge(rows, get_scheduler(name).refresh(asked, os.environ))
    now = store.now()
    sys.stdout.write(view.as_json(rows, now, problems) if as_json else view.table(rows, now))
    return 0


def _by_run_id(action: str, argv: list[str]) -> int:
    """``clusterddp status|stop|logs RUN``: the run's record says where it runs; a local or
    SSH run is handled here (clusterddp.registry.local), a submitted one by its scheduler's
    own action with the options ``submit`` recorded."""
    from clusterddp.registry import local, store, view

    parser = _Parser(prog=f"clusterddp {action}", add_help=False)
    parser.add_argument("run")
    if action == "logs":
        parser.add_argument("-f", "--follow", action="store_true")
        parser.add_argument("--rank", type=_rank)
    args = parser.parse_args(argv)
    record = store.find(args.run)
    follow, rank = getattr(args, "follow", False), getattr(args, "rank", None)
    if record.head:  # a detached SSH run: its head's host answers
        from clusterddp.launch import remotehead

        if action == "stop":
            return remotehead.stop(record)
        if action == "logs":
            return remotehead.command(record, ["logs", record.run_id, *(["-f"] if follow else []),
                                               *(["--rank", str(rank)] if rank is not None else [])])
        row = view.live(record)
        view.merge([row], remotehead.refresh([record]) if record.state not in store.FINAL else {})
        for line in view.status_lines(row, store.now()):
            print(line)
        return 0
    if record.target in ("local", "ssh"):
        if action == "stop":
            return local.stop(record)
        if action == "logs":
            return local.logs(record, follow, rank)
        for line in view.status_lines(view.live(record, _goodput), store.now()):
            print(line)
        return 0
    from clusterddp.schedulers import get_scheduler

    scheduler = get_scheduler(record.target)
    scheduler.check_action(action)
    values = dict(record.scheduler_options)
    values[str(values.pop("id_field", "job_id"))] = record.job_id
    takes = {flag.dest for flag in scheduler.flags_for(action)}
    values.update({key: value for key, value in (("follow", follow), ("rank", rank)) if key in takes})
    return int(scheduler.main(scheduler.options(action, {k: v for k, v in values.items() if k in takes})))


def _rank(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 7:
        raise ValueError(raw)
    return int(raw)


def _record_submit(scheduler: Scheduler[Any], options: Any) -> None:
    """A submitted job goes into the run registry as ``<scheduler>-<its id>``, pending."""
    from clusterddp.registry import track
    from clusterddp.spec import load_job

    submitted = scheduler.submitted
    if submitted is None:
        return
    job = load_job(str(options.job))
    track.begin(scheduler.name, validate.as_token(f"{scheduler.name}-{submitted.job_id}"), job.name,
                submitted.run_dir, job_file=str(options.job), hosts=[], job_id=submitted.job_id,
                where=submitted.where, state="pending", launcher=False, console=submitted.console,
                scheduler_options={**submitted.options, "id_field": submitted.id_field})


def _pack(output: str | None) -> int:
    """Write the launcher's zipapp and say how a container runs it."""
    from clusterddp import pack
    from clusterddp.atomicfile import output_path

    path = output_path(pack.default_output() if output is None else output, "pack")
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


def _sizes(raw: str) -> tuple[int, ...] | None:
    problem = validate.line_problem(raw)
    if problem:
        raise flags.FlagProblem(problem)
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    if not all(validate.INTEGER_TEXT.fullmatch(part) for part in parts):
        raise flags.FlagProblem(f"expected sizes in bytes like 8,65536, got {validate.shown(raw)}")
    return tuple(int(part) for part in parts) or None


def _fraction(value: float) -> str | None:
    return None if 0 < value <= 1 else f"must be > 0 and <= 1, got {value}"


#: The value flags of the other commands (``stacks``, ``doctor``) and the positional paths:
#: (flag, converter); the run flags' rows are ``launch.flags.RUN_FLAGS``.
TOOL_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "timeout": ("--timeout", flags.checked(flags.number, validate.positive_seconds_problem)),
    "iters": ("--iters", flags.checked(flags.integer, validate.workers_problem)),
    "partners": ("--partners", flags.checked(flags.integer, validate.nodes_problem)),
    "slow_fraction": ("--slow-fraction", flags.checked(flags.number, _fraction)),
    "sizes": ("--sizes", _sizes),
    "job": ("JOB", flags.text(validate.path_problem)),
    "target": ("TARGET", flags.text(validate.path_problem)),
}


def _converters() -> list[tuple[str, str, Callable[[str], Any], str | None]]:
    """(dest, flag, converter, CLUSTERDDP_* variable) of every value flag, run flags first; a
    run row also checks another command's flag of its name (``doctor --hostfile``)."""
    rows = [(row.dest, row.name, row.convert, row.environ) for row in flags.RUN_FLAGS
            if row.convert is not None and not row.repeat]
    return rows + [(dest, flag, convert, None) for dest, (flag, convert) in TOOL_FLAGS.items()]


def _typed(args: argparse.Namespace, env: Mapping[str, str]) -> argparse.Namespace:
    """Convert and validate every flag (as typed) and every CLUSTERDDP_* fallback (as set).

    Defaults are never computed from the environment while the parser is built, so a bad
    ``CLUSTERDDP_NNODES`` cannot break ``--help`` or ``--version``; it fails here, naming the
    variable, only for the commands that read it."""
    for dest, flag, convert, variable in _converters():
        if not hasattr(args, dest):
            continue
        raw, where = getattr(args, dest), flag
        if raw is None and variable and env.get(variable, "") != "":
            raw, where = env[variable], variable
        if isinstance(raw, str):
            setattr(args, dest, _convert(where, convert, raw))
    for row in flags.RUN_FLAGS:  # a switch's variable (CLUSTERDDP_NO_MERGE=1) when not given
        if row.convert is None and row.environ and hasattr(args, row.dest) and not getattr(args, row.dest):
            setattr(args, row.dest, _convert(row.environ, flags.switch, env.get(row.environ, "")))
    for row in flags.RUN_FLAGS:  # repeated flags (--include): each item passes the rule
        if row.repeat and row.convert is not None:
            for raw in getattr(args, row.dest, None) or ():
                _convert(row.name, row.convert, raw)
    limit = env.get(validate.MAX_WORKERS_ENV, "")
    if limit and validate.int_text_problem(limit, 1, 1 << 20):
        raise ClusterDDPError(f"{validate.MAX_WORKERS_ENV}: {validate.int_text_problem(limit, 1, 1 << 20)}")
    return args


def _convert(where: str, convert: Callable[[str], Any], raw: str) -> Any:
    """``convert(raw)``; its problem as one line naming the flag or variable."""
    try:
        return convert(raw)
    except flags.FlagProblem as exc:
        raise ClusterDDPError(f"{where}: {exc}") from None


def _add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The run flags' rows (``launch.flags.RUN_FLAGS``) as arguments, in their ``--help``
    sections; ``env`` takes the placement ones."""
    groups: dict[str, Any] = {}
    for row in flags.RUN_FLAGS:
        if command == "env" and not row.env_command:
            continue
        if row.group not in groups:
            groups[row.group] = parser.add_argument_group(row.group)
        settings: dict[str, Any] = {key: value for key, value in (("help", row.help), ("metavar", row.metavar),
                                                                  ("default", row.default)) if value is not None}
        if row.convert is None:
            settings["action"] = "store_true"
        elif row.repeat:
            settings.update(action="append", default=[])
        groups[row.group].add_argument(row.name, **settings)


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser; ``run`` and ``env`` take their flags from the rows."""
    parser = _Parser(
        prog="clusterddp",
        description="Run one PyTorch DDP job file here, over SSH, on SLURM, on OpenPAI or on Kubernetes "
                    "(TrainJob, JobSet, PyTorchJob).")
    parser.add_argument("--version", action="version", version=f"clusterddp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="start the job's workers on this node (or on every host of a hostfile)",
                         description="Start the job. 'clusterddp run --nproc-per-node 2 -- train.py --lr 0.1' "
                                     "runs a script without a job file, like torchrun.")
    run.add_argument("job", nargs="?", help="job file (jobs/*.yaml)")
    _add_flags(run, "run")

    env = sub.add_parser("env", help="show the detected cluster environment and the topology it gives")
    env.add_argument("job", nargs="?", help="job file (for nproc_per_node, master)")
    env.add_argument("--json", action="store_true", help="machine-readable output")
    _add_flags(env, "env")

    _add_tool_commands(sub)
    _add_scheduler_commands(sub)
    return parser


def _add_tool_commands(sub: Any) -> None:
    """``stacks`` and ``doctor``: the diagnostics beside ``run``."""
    stacks = sub.add_parser("stacks", help="dump every worker's Python stack of a running job")
    stacks.add_argument("target", nargs="?", help="run id or log directory (default: the newest run)")
    stacks.add_argument("--log-dir", default="logs")
    stacks.add_argument("--timeout", default="10.0")

    report = sub.add_parser("report", help="a run's timeline and goodput, from logs/<run-id>/events*.jsonl")
    report.add_argument("target", nargs="?", help="run id or log directory (default: the newest run)")
    report.add_argument("--log-dir", default="logs")
    report.add_argument("--json", action="store_true", help="one JSON document instead of text")
    attach = sub.add_parser("attach", help="a detached run's console from its first line, followed to its end",
                            description="Print the console of a run started with --detach from its first line, "
                                        "follow it to the run's end and exit with the run's exit code; Ctrl-C "
                                        "stops following and leaves the run going (docs/runs.md).")
    attach.add_argument("run", help="run id, or the start of one (clusterddp ls)")
    ls = sub.add_parser("ls", help="the runs this machine started, on every target, and how they are doing",
                        description="Every run recorded under $CLUSTERDDP_HOME (see docs/runs.md): id, target, "
                                    "where, state, attempts, start, duration, exit code and root cause, goodput.")
    ls.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    ls.add_argument("--refresh", action="store_true",
                    help="ask every platform again, for finished runs too (one call per target)")
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
        by_run = " (or of any run by its id: RUN from 'clusterddp ls')" if action in RUN_ACTIONS else ""
        p = sub.add_parser(action, help=f"{what} on a scheduler ({', '.join(names)}){by_run}", add_help=False)
        p.add_argument("scheduler", help=" or ".join(names))


class _SchedulerParser(argparse.ArgumentParser):
    """A scheduler's flags: a usage mistake is one ``clusterddp: error: clusterddp ACTION
    SCHEDULER: ...`` line and exit 2 instead of argparse's usage block."""

    def error(self, message: str) -> typing.NoReturn:
        # argparse quotes the value whole ("invalid namespace value: '...'"): cut like the others.
        raise ClusterDDPError(f"{self.prog}: {validate.clip(message, 300)}", f"see '{self.prog} --help'")


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
    return flags.apply_to_job(job, vars(args))


def options_from(cls: type[_Options], args: argparse.Namespace, **values: Any) -> _Options:
    """The typed options ``cls`` of a library entry point, from the flags it has (as ``_typed``
    converted them); a flag not given leaves the dataclass's default."""
    for item in fields(cls):  # type: ignore[arg-type]
        value = getattr(args, item.name, None)
        if value is not None and item.name not in values:
            values[item.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def run_options(args: argparse.Namespace) -> RunOptions:
    """``clusterddp run``'s (or ``env``'s) options, from its flags as ``_typed`` converted them."""
    from clusterddp.launch.options import RunOptions

    return options_from(RunOptions, args, passed_on=flags.passed_on(vars(args)))


def _run(args: argparse.Namespace) -> int:
    """``clusterddp run``: the job fanned out over SSH, or run on this node (``launch.run``);
    the launcher's exit code."""
    from clusterddp.launch.run import run

    return run(_load(args), run_options(args), args.argv, os.environ, _goodput)


def _goodput(run_dir: str) -> float | None:
    """``clusterddp report``'s goodput of a run; None without events or steps."""
    from clusterddp.diagnose.goodput import analyse

    try:
        result, events = analyse(run_dir)
    except (ClusterDDPError, OSError, ValueError, KeyError, TypeError):
        return None
    # Without a step record (a script that reports no steps) there is no training time to count.
    return result.goodput if any(event["kind"] == "first_step" for event in events) else None


def _env(args: argparse.Namespace) -> int:
    from clusterddp.envs import detect, known_environments
    from clusterddp.spec import JobSpec
    from clusterddp.topology import resolve

    args.script_command = []
    job = _load(args) if args.job else JobSpec(name="env", script="-", nproc_per_node=args.nproc_per_node or "auto")
    environment = detect(dict(os.environ), run_options(args).overrides(job if args.job else None))
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
