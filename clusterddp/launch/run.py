"""``clusterddp run``: where one run goes (the SSH fan-out or this node), in this terminal or
detached, and its record in the run registry (``clusterddp.registry``): decided in one place,
before anything starts."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace
from typing import Callable, MutableMapping

from clusterddp import earlystop
from clusterddp.envs import detect
from clusterddp.errors import ClusterDDPError
from clusterddp.launch import flags
from clusterddp.launch.options import RunOptions, wants_fanout
from clusterddp.registry.detach import DETACHED_ENV
from clusterddp.spec import JobSpec
from clusterddp.topology import default_run_id

#: A run directory's goodput (``clusterddp report``'s), kept in the run's record at its end.
Goodput = Callable[[str], "float | None"]


def run(job: JobSpec, options: RunOptions, argv: list[str], env: MutableMapping[str, str],
        goodput: Goodput) -> int:
    """Run ``job``; the launcher's exit code. ``env``: the process environment (a detached
    launcher finds its console there, and takes it out: it never detaches again)."""
    console = env.pop(DETACHED_ENV, None)
    fanout = wants_fanout(job, options)
    recorded = records_itself(job, options, fanout, env)
    if recorded:  # the run id fixed here, before the launch, so the record names the run's directory
        options = replace(options, run_id=options.run_id or default_run_id(job.name))
    if job.detach and console is None and not options.dry_run:
        return start_detached(job, options, argv, fanout, recorded)
    start: Callable[[], int]
    if fanout:
        from clusterddp.launch.ssh.fanout import fanout_options, run_fanout

        start = lambda: run_fanout(job, fanout_options(options))  # noqa: E731
    else:
        from clusterddp.launch.local import run_local

        start = lambda: run_local(job, options, dict(env))  # noqa: E731
    if not recorded:  # a node of a bigger run, or a dry run: whoever started it records it
        return start()
    return tracked("ssh" if fanout else "local", job, options, start, goodput,
                   hosts=[] if fanout else None, console=console)


def records_itself(job: JobSpec, options: RunOptions, fanout: bool, env: MutableMapping[str, str]) -> bool:
    """A run typed here (not a dry run, not a node the SSH head, the sbatch script or a flag
    placed, not under a scheduler): it goes into the run registry. A fan-out's head always
    does (its hosts' launchers do not)."""
    if options.dry_run:
        return False
    if fanout:
        return True
    overrides = options.overrides(job)
    if options.watch_stdin or options.marks_dir is not None or overrides.any_given:
        return False
    return detect(dict(env), overrides).name == "local"


def start_detached(job: JobSpec, options: RunOptions, argv: list[str], fanout: bool, recorded: bool) -> int:
    """``run --detach``: the same run started again in its own session (clusterddp.registry.detach);
    back once every rank runs, or with the launcher's own refusal when it ended first."""
    from clusterddp.registry import detach

    if not fanout and not recorded:
        raise ClusterDDPError(f"{job.where('detach')}: only a run this machine starts alone can detach, "
                              "not a node placed by flags or a scheduler")
    run_id = str(options.run_id)
    name = {row.dest: row.name for row in flags.RUN_FLAGS}  # the flags as their rows spell them
    own, script = (argv[1:], []) if "--" not in argv else (argv[1:argv.index("--")], argv[argv.index("--"):])
    args = [*[a for a in own if a != name["detach"]], name["run_id"], run_id, *script]
    if fanout:  # the head goes to the first host (clusterddp.launch.remotehead)
        from clusterddp.launch.remotehead import detach as detach_ssh

        return detach_ssh(job, options, args)
    child = [sys.executable, "-m", "clusterddp", "run", *args]
    run_dir = os.path.abspath(os.path.join(job.logs.dir, run_id))
    proc, console = detach.start(child, run_dir, os.environ)
    if not detach.wait_running(proc, run_id, run_dir):
        if proc.returncode == 0:  # a short job: it ran and ended before its ranks were seen
            print(run_id)
            print(f"clusterddp: run {run_id} detached and already finished (exit 0); its console: {console}\n"
                  f"  clusterddp attach {run_id}", file=sys.stderr)
            return 0
        with open(console, "rb") as f:  # its own refusal, as 'run' would have printed it
            sys.stderr.write(f.read(1 << 16).decode("utf-8", "replace"))
        return proc.returncode
    print(run_id)
    print(f"clusterddp: run {run_id} detached (launcher pid {proc.pid}), every rank running; its console: "
          f"{console}\n  clusterddp attach {run_id}    # its console from the first line, then follow "
          f"(Ctrl-C leaves it running)\n  clusterddp ls | status {run_id} | logs {run_id} [-f] | stop {run_id}",
          file=sys.stderr)
    return 0


def tracked(target: str, job: JobSpec, options: RunOptions, start: Callable[[], int], goodput: Goodput,
            hosts: list[str] | None = None, console: str | None = None) -> int:
    """``start()`` recorded in the run registry: once when it starts, once when it ends
    (whatever ends it: its exit code, a stop signal, a refusal)."""
    from clusterddp.registry import track

    run_id = str(options.run_id)
    record = track.begin(target, run_id, job.name, os.path.join(job.logs.dir, run_id),
                         job_file=job.source, hosts=hosts, console=console or "", detached=console is not None)
    code = 1
    try:
        code = start()
        return code
    except earlystop.StoppedEarly as exc:
        code = 128 + exc.signum
        raise
    except ClusterDDPError as exc:
        code = exc.exit_code
        raise
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
        raise
    finally:
        track.end(record, code, goodput(record.run_dir) if record is not None else None)
