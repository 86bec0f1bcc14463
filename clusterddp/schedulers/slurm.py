"""``clusterddp render slurm JOB`` and ``clusterddp submit slurm JOB``: sbatch from the job file.

``render_sbatch`` is pure (job in, script text out) so it is golden-tested; ``main`` adds the
file system and ``sbatch``. The script runs ``srun --ntasks-per-node=1 <python> -m clusterddp
run JOB``: one launcher per node, which reads its place from SLURM's variables
(clusterddp.envs.slurm) and supervises that node's workers.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import string
import subprocess
import sys
import time
from pathlib import Path

from clusterddp import __version__
from clusterddp.errors import JobSpecError, SubmitError
from clusterddp.exitcodes import PREEMPTED
from clusterddp.sections.slurm import signal_name, signals_batch_shell
from clusterddp.spec import JobSpec, load_job
from clusterddp.templates import load_template

TEMPLATE = "slurm.sbatch"


def render_sbatch(job: JobSpec, job_path: str, *, python: str | None = None) -> str:
    """The sbatch script for ``job``; ``job_path`` is how every node's launcher finds the file.

    ``python`` is the interpreter on the nodes (default: the job's ``python``, else this one).
    Every template variable must be supplied: a missing one raises instead of rendering empty.
    """
    slurm = job.slurm
    log_dir = job.logs.dir
    interpreter = python or job.python or sys.executable
    nodes = job.nodes
    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if slurm.cpus_per_task:
        # srun 22.05-23.02 does not inherit --cpus-per-task; the one launcher task needs them all.
        srun.append(f"--cpus-per-task={slurm.cpus_per_task}")
    srun += [interpreter, "-m", "clusterddp", "run", job_path]
    values = {
        "version": __version__,
        "job_file": shlex.quote(job_path),
        "log_dir": shlex.quote(log_dir),
        "sbatch_options": "\n".join(sbatch_options(job)),
        "setup": "".join(f"{line}\n" for line in slurm.setup),
        "exports": "".join(f"export {name}={shlex.quote(str(value))}\n" for name, value in sorted(job.env.items())),
        "traps": _traps(slurm.signal),
        "srun_command": " ".join(shlex.quote(part) for part in srun),
        "preempted": str(PREEMPTED),
        "requeue": "1" if slurm.requeue else "0",
    }
    try:
        return string.Template(load_template(TEMPLATE)).substitute(values)
    except (KeyError, ValueError) as exc:
        raise JobSpecError(job.source or job_path, None, "slurm",
                           f"template {TEMPLATE} needs a value the renderer does not give: {exc}") from None


def sbatch_options(job: JobSpec) -> list[str]:
    """The ``#SBATCH`` lines, sorted by flag, then the job's extra lines in their order."""
    slurm = job.slurm
    options: dict[str, str | None] = {
        "job-name": job.name,
        "nodes": str(job.nodes),
        "ntasks-per-node": "1",
        "output": slurm.output or f"{job.logs.dir.rstrip('/')}/%x-%j.out",
    }
    optional = {
        "partition": slurm.partition, "account": slurm.account, "qos": slurm.qos,
        "constraint": slurm.constraint, "mem": slurm.mem, "time": slurm.time, "error": slurm.error,
        "signal": slurm.signal,
        "gpus-per-node": None if slurm.gpus_per_node is None else str(slurm.gpus_per_node),
        "cpus-per-task": None if slurm.cpus_per_task is None else str(slurm.cpus_per_task),
    }
    for flag, value in optional.items():
        if value is not None:
            _check_value(job, flag, value)
            options[flag] = value
    if slurm.exclusive:
        options["exclusive"] = None
    if slurm.requeue:
        options["requeue"] = None
        options["open-mode"] = "append"  # keep the first run's output when the job runs again
    else:
        options["no-requeue"] = None
    lines = [f"#SBATCH --{flag}" if value is None else f"#SBATCH --{flag}={value}"
             for flag, value in sorted(options.items())]
    for line in slurm.extra_sbatch:
        option = line.strip()
        if option.startswith("#SBATCH"):
            option = option[len("#SBATCH"):].strip()
        lines.append(f"#SBATCH {option}")
    return lines


def _check_value(job: JobSpec, flag: str, value: str) -> None:
    """Empty or multi-word values would make sbatch read a different option: refuse them."""
    if not value.strip() or any(c.isspace() for c in value):
        raise JobSpecError(job.source or "<job>", None, f"slurm.{flag.replace('-', '_')}",
                           f"invalid value {value!r}: must be non-empty, without blanks")


def _traps(signal_spec: str | None) -> str:
    """Trap the preemption signal in the batch shell when ``--signal=B:...`` sends it there."""
    if not signal_spec or not signals_batch_shell(signal_spec):
        return ""
    name = signal_name(signal_spec)
    return f"trap 'forward_signal {name}' {name}\n"


def build_parser(action: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"clusterddp {action} slurm",
                                     description="Render the job file as an sbatch script"
                                     + (" and submit it with sbatch." if action == "submit" else "."))
    parser.add_argument("job", help="job file (jobs/*.yaml)")
    parser.add_argument("--python", help="interpreter on the compute nodes (default: the job's python, else this one)")
    if action == "render":
        parser.add_argument("-o", "--output", help="write the script here instead of printing it")
    else:
        parser.add_argument("--dry-run", action="store_true", help="print the script and the sbatch command, submit nothing")
    return parser


def main(action: str, argv: list[str]) -> int:
    """``render`` prints or writes the script; ``submit`` also runs ``sbatch --parsable``."""
    if action not in ("render", "submit"):
        raise SubmitError(f"slurm supports 'render' and 'submit', not {action!r}")
    args = build_parser(action).parse_args(argv)
    job = load_job(args.job)
    job_path = os.path.abspath(args.job)  # every node's launcher reads it (shared file system)
    script = render_sbatch(job, job_path, python=args.python)
    if action == "render":
        if args.output:
            Path(args.output).write_text(script, encoding="utf-8")
            print(f"wrote {args.output}; submit it with: mkdir -p {shlex.quote(job.logs.dir)} && sbatch {shlex.quote(args.output)}")
        else:
            sys.stdout.write(script)
        return 0
    return _submit(job, script, dry_run=args.dry_run)


def _submit(job: JobSpec, script: str, dry_run: bool) -> int:
    """Write the script into the log dir (it documents the run), then ``sbatch --parsable`` it."""
    log_dir = Path(job.logs.dir)
    path = log_dir / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    command = ["sbatch", "--parsable", str(path)]
    if dry_run:
        sys.stdout.write(script)
        print(f"# dry run: would write {path} and run: {shlex.join(command)}")
        return 0
    if shutil.which("sbatch") is None:
        raise SubmitError("sbatch is not on PATH", "run this on a SLURM login node, or use 'render' and copy the script")
    log_dir.mkdir(parents=True, exist_ok=True)  # sbatch does not create the output's directory
    path.write_text(script, encoding="utf-8")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SubmitError(f"sbatch failed with exit code {result.returncode} (script kept at {path})")
    job_id = result.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"
    output = (job.slurm.output or f"{job.logs.dir.rstrip('/')}/%x-%j.out").replace("%x", job.name).replace("%j", job_id)
    print(job_id)
    print(f"clusterddp: submitted job {job_id}; script {path}; batch log {output}; "
          f"worker logs under {job.logs.dir}/{job_id}/", file=sys.stderr)
    return 0
