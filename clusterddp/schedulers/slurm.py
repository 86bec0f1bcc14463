"""``clusterddp render slurm JOB`` and ``clusterddp submit slurm JOB``: sbatch from the job file.

``render_sbatch`` is pure (job in, script text out) so it is golden-tested; ``SlurmScheduler``
(clusterddp.schedulers.api) adds the file system and ``sbatch``. The script runs ``srun --ntasks-per-node=1 <python> -m clusterddp
run JOB``: one launcher per node, which reads its place from SLURM's variables
(clusterddp.envs.slurm) and supervises that node's workers. With ``restarts: N`` it runs a
failed step again inside the allocation, on the nodes SLURM still reports healthy.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from clusterddp import __version__, pack, protocol
from clusterddp.errors import JobSpecError, SubmitError
from clusterddp.exitcodes import MAX_BACKOFF, NONFINITE_LOSS, PREEMPTED
from clusterddp.sections.slurm import SIGNAL, signal_name, signals_batch_shell
from clusterddp.spec import JobSpec
from clusterddp.redact import passthrough_env, scrub
from clusterddp.registry.store import RunRecord
from clusterddp.schedulers.common import write_output
from clusterddp.schedulers import quoting as q
from clusterddp.schedulers.api import Flag, RenderedRequest, Scheduler, Submitted
from clusterddp.schedulers.slurm_container import container_step, launcher_path
from clusterddp.templates import load_template
from clusterddp.validate import MAX_COUNT, shown

TEMPLATE = "slurm.sbatch"
#: The batch shell's own record of how the job ended ("STATUS LAST_ATTEMPT"), in
#: ``<logs.dir>/<job id>/launchers/``: read by ``clusterddp ls`` once the job has left squeue.
OUTCOME_FILE = "outcome"


def render_sbatch(job: JobSpec, job_path: str, *, python: str | None = None, workdir: str | None = None) -> str:
    """The sbatch script for ``job``; ``job_path`` is how every node's launcher finds the file.

    ``python`` is the interpreter on the nodes (default: the job's ``python``, else this one).
    Every value is checked and quoted for where it lands (clusterddp.schedulers.quoting), so no
    value can end a directive, a comment or a shell word early. Every template variable must
    be supplied: a missing one raises instead of rendering empty.

    The script runs the srun step up to ``1 + restarts`` times inside the allocation (see
    docs/slurm.md, "Fault tolerance"): each launcher gets ``--restart-count ATTEMPT``.

    A refusal names the job file's line of the key at fault (``JobSpec.placed``).

    With ``container.image`` the step runs in that image (clusterddp.schedulers.slurm_container);
    ``workdir`` is the container's working directory when ``container.workdir`` is not given.
    """
    try:
        return _render_sbatch(job, job_path, python, workdir)
    except JobSpecError as exc:
        raise job.placed(exc) from None


def _render_sbatch(job: JobSpec, job_path: str, python: str | None, workdir: str | None) -> str:
    where = q.place(job.source, job_path)
    slurm = job.slurm
    job_word = q.path_word(job_path, where, "job file path")
    interpreter = python or job.python or sys.executable
    low, high = q.node_range(job, where)
    srun = ["--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if slurm.cpus_per_task is not None:
        # srun 22.05-23.02 does not inherit --cpus-per-task; the one launcher task needs them all.
        srun.append(f"--cpus-per-task={q.integer(slurm.cpus_per_task, where, 'slurm.cpus_per_task', 1)}")
    launcher = [q.shell_word(interpreter, where, "python"), "-m", "clusterddp", "run", job_word]
    container_setup = container_attempt = ""
    launcher_cwd = pyz = None  # bare nodes: srun starts each launcher in this shell's directory
    if job.container.enabled:
        step = container_step(job, job_path, where, python, workdir)
        srun.extend(step.srun_options)
        launcher = list(step.launcher)
        container_setup, container_attempt, launcher_cwd, pyz = step.setup, step.attempt, step.workdir, step.pyz
    values = {
        "version": __version__,
        "job_file": job_word,
        "by_hand": by_hand(job, "THIS_FILE", pyz, where),
        "sbatch_options": "\n".join(sbatch_options(job, where)),
        "setup": _setup(job, where),
        "exports": _exports(job, where),
        "container_setup": container_setup,
        "container_attempt": container_attempt,
        "traps": _traps(slurm.signal, where),
        "launcher": " ".join(launcher),
        "srun_options": " ".join(srun),
        "min_nodes": str(low),
        "max_nodes": str(high),
        "restarts": q.integer(job.restarts, where, "restarts", maximum=MAX_COUNT),
        "retry_same_launch": "1" if job.restart_on.deterministic else "0",
        "max_backoff": str(int(MAX_BACKOFF)),
        "doublings": str(math.ceil(math.log2(MAX_BACKOFF))),  # 1 << this is MAX_BACKOFF or more
        "preempted": str(PREEMPTED),
        "nonfinite": str(NONFINITE_LOSS),
        "requeue": "1" if slurm.requeue else "0",
        "marks_root": _records_root(job, where, launcher_cwd),
        "started_name": protocol.mark_name("$i", protocol.MARK_STARTED),
        "exit_name": protocol.mark_name("$i", protocol.MARK_EXIT),
        "failure_name": protocol.mark_name("$i", protocol.MARK_FAILURE),
        "attempt_name": protocol.mark_name("$i", protocol.MARK_ATTEMPT),
        "outcome_name": OUTCOME_FILE,
    }
    try:
        return string.Template(load_template(TEMPLATE)).substitute(values)
    except (KeyError, ValueError) as exc:
        raise JobSpecError(where, None, "slurm",
                           f"template {TEMPLATE} needs a value the renderer does not give: {exc}") from None


def by_hand(job: JobSpec, script: str, pyz: str | None, where: str = "<job>") -> str:
    """The commands that submit the script without ``clusterddp submit``: the log directory
    first (sbatch does not make it), then, for a container job, the zipapp ``pyz`` its
    container runs (submit builds it; without it the script stops with exit 2), then sbatch."""
    steps = [f"mkdir -p {q.path_word(job.logs.dir, where, 'logs.dir')}",
             *([f"clusterddp pack -o {shlex.quote(pyz)}"] if pyz else []), f"sbatch {script}"]
    return " && ".join(steps)


def _records_root(job: JobSpec, where: str, launcher_cwd: str | None) -> str:
    """Where the launchers record each attempt (``logs.dir`` as every launcher sees it, so in
    the container too): a relative logs.dir starts at the launcher's working directory, the
    batch shell's own on bare nodes, the container's (mounted at its own path) otherwise."""
    logs = job.logs.dir
    word = q.path_word(logs, where, "logs.dir")
    if os.path.isabs(logs):
        return word
    if launcher_cwd is not None:
        return q.path_word(os.path.join(launcher_cwd, logs), where, "logs.dir")
    return '"$PWD"/' + word


def _setup(job: JobSpec, where: str) -> str:
    lines = [q.setup_line(line, where, f"slurm.setup[{i}]") + "\n" for i, line in enumerate(job.slurm.setup)]
    if not lines:
        return ""
    return "# slurm.setup: one eval per line, so no line can change how the lines after it parse\n" + "".join(lines)


def _exports(job: JobSpec, where: str) -> str:
    """``export NAME=VALUE`` for the job's ``env:``; ``env_passthrough`` names are never here
    (their values come from the submitting shell through ``--export``)."""
    lines = []
    for name, value in sorted(job.env.items()):
        key = f"env.{q.env_name(name, where, 'env')}"
        if name in job.env_passthrough:
            raise q.fail(where, key, f"{name} is also in env_passthrough", "keep a secret in env_passthrough only")
        lines.append(f"export {name}={q.shell_word(value, where, key)}\n")
    return "".join(lines)


def default_output(job: JobSpec) -> str:
    """The batch log, ``logs.dir/%x-%j.out`` unless ``slurm.output`` says otherwise."""
    return job.slurm.output or f"{job.logs.dir.rstrip('/')}/%x-%j.out"


def sbatch_options(job: JobSpec, where: str = "<job>") -> list[str]:
    """The ``#SBATCH`` lines, sorted by flag, then the job's extra lines in their order."""
    slurm = job.slurm
    low, high = q.node_range(job, where)
    options: dict[str, str | None] = {
        "job-name": q.token(job.name, where, "name"),
        # MIN-MAX: SLURM allocates as many nodes as it can start the job with, and the step
        # runs on those (SLURM_JOB_NUM_NODES).
        "nodes": str(low) if low == high else f"{low}-{high}",
        "output": q.directive_value(default_output(job), where, "slurm.output" if slurm.output else "logs.dir"),
    }
    if low == high:
        # Not with MIN-MAX: sbatch then sets ntasks = MIN x 1, and SLURM allocates MIN nodes even
        # when MAX are idle (seen on 22.05); the srun step gives its own --ntasks-per-node=1.
        options["ntasks-per-node"] = "1"
    for flag in ("partition", "account", "qos", "constraint", "mem", "time", "signal"):
        value = getattr(slurm, flag)
        if value is not None:
            options[flag] = _plain_value(value, where, f"slurm.{flag}")
    if slurm.error is not None:
        options["error"] = q.directive_value(slurm.error, where, "slurm.error")
    for flag, minimum in (("gpus_per_node", 0), ("cpus_per_task", 1)):
        value = getattr(slurm, flag)
        if value is not None:
            options[flag.replace("_", "-")] = q.integer(value, where, f"slurm.{flag}", minimum)
    if job.env_passthrough:
        names = [q.env_name(n, where, f"env_passthrough[{i}]") for i, n in enumerate(job.env_passthrough)]
        options["export"] = ",".join(["ALL", *names])  # by name: the value never enters the script
    if slurm.exclusive:
        options["exclusive"] = None
    if q.integer(job.restarts, where, "restarts", maximum=MAX_COUNT) != "0":
        options["no-kill"] = None  # a failed node leaves the allocation; the others restart the step
    if slurm.requeue:
        options["requeue"] = None
        options["open-mode"] = "append"  # keep the first run's output when the job runs again
    else:
        options["no-requeue"] = None
    lines = [f"#SBATCH --{flag}" if value is None else f"#SBATCH --{flag}={value}"
             for flag, value in sorted(options.items())]
    for index, line in enumerate(slurm.extra_sbatch):
        directive = q.extra_directive(line, where, f"slurm.extra_sbatch[{index}]")
        if job.env_passthrough and q.option_name(directive) == "--export":
            raise q.fail(where, f"slurm.extra_sbatch[{index}]", "--export would replace the one env_passthrough needs",
                         "list the variables in env_passthrough instead")
        lines.append(f"#SBATCH {directive}")
    return lines


def _plain_value(value: str, where: str, key: str) -> str:
    """Partition, account, time...: sbatch's own formats have no blanks or quotes; one that
    does is a typo that would become a different option, so it is refused, not quoted."""
    if not isinstance(value, str) or not value.strip() or any(c.isspace() or c in "'\"\\#" for c in value):
        raise q.fail(where, key, f"invalid value {shown(value)}: must be non-empty, without blanks, quotes or '#'")
    return q.directive_value(value, where, key)


def _traps(signal_spec: str | None, where: str = "<job>") -> str:
    """Trap the preemption signal in the batch shell when ``--signal=B:...`` sends it there."""
    if not signal_spec:
        return ""
    if not isinstance(signal_spec, str) or not SIGNAL.fullmatch(signal_spec):
        raise q.fail(where, "slurm.signal", f"invalid value {shown(signal_spec)} (expected [B:]NAME[@SECONDS])")
    if not signals_batch_shell(signal_spec):
        return ""
    name = signal_name(signal_spec)
    return f"trap 'forward_signal {name}' {name}\n"


def rank_number(raw: str) -> int:
    """``--rank R``: a rank, 0 .. MAX_COUNT (argparse names the flag in its refusal)."""
    if not raw.isdigit() or int(raw) > MAX_COUNT:
        raise ValueError(raw)
    return int(raw)


@dataclass(frozen=True)
class SlurmOptions:
    """``clusterddp render|submit slurm`` as the CLI parsed it."""

    action: str
    #: The job file; every node's launcher reads it (a shared file system is assumed).
    job: str | None = None
    #: ``status``/``stop``/``logs``: the id ``submit`` printed.
    job_id: str | None = None
    #: ``logs``: follow until the job ends; one rank's own log instead of the batch log.
    follow: bool = False
    rank: int | None = None
    #: Interpreter on the compute nodes (default: the job's python, else this one).
    python: str | None = None
    #: ``render``: write the script here instead of printing it.
    output: str | None = None
    #: ``submit``: print the script and the sbatch command, submit nothing.
    dry_run: bool = False


class SlurmScheduler(Scheduler[SlurmOptions]):
    """``render`` prints or writes the sbatch script; ``submit`` also runs ``sbatch --parsable``."""

    name = "slurm"
    actions = ("render", "submit", "status", "stop", "logs")
    options_type = SlurmOptions
    descriptions = {
        "render": "Render the job file as an sbatch script.",
        "submit": "Render the job file as an sbatch script and submit it with sbatch.",
        "status": "The state of a job 'submit' started (also after it has left squeue).",
        "stop": "scancel a job 'submit' started: SIGTERM to every step, SIGKILL after SLURM's KillWait.",
        "logs": "Print (or follow) the batch log of a job 'submit' started, or one rank's log.",
    }
    flags = (
        Flag("job", help="job file (jobs/*.yaml)", actions=("render", "submit")),
        Flag("job_id", metavar="JOBID", help="the job id 'submit' printed", actions=("status", "stop", "logs")),
        Flag("follow", ("-f", "--follow"), switch=True, help="follow the log until the job ends", actions=("logs",)),
        Flag("rank", ("--rank",), convert=rank_number, metavar="R", help="this rank's own log", actions=("logs",)),
        Flag("python", ("--python",),
             help="interpreter on the compute nodes (default: the job's python, else this one)"),
        Flag("output", ("-o", "--output"), help="write the script here instead of printing it", actions=("render",)),
        Flag("dry_run", ("--dry-run",), switch=True, actions=("submit",),
             help="print the script and the sbatch command, submit nothing"),
    )

    def render(self, job: JobSpec, options: SlurmOptions) -> RenderedRequest:
        """The script with the job's absolute path: every node's launcher reads that file."""
        script = render_sbatch(job, os.path.abspath(str(options.job)), python=options.python, workdir=os.getcwd())
        return RenderedRequest(script, "sbatch --parsable SCRIPT (written under logs.dir first)", job)

    def status(self, options: SlurmOptions, env: Mapping[str, str]) -> int:
        from clusterddp.schedulers import slurm_runs

        return slurm_runs.status(str(options.job_id), env)

    def stop(self, options: SlurmOptions, env: Mapping[str, str]) -> int:
        from clusterddp.schedulers import slurm_runs

        return slurm_runs.stop(str(options.job_id), env)

    def refresh(self, records: Sequence[RunRecord], env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """One squeue for every run, then sacct or each job's own record (slurm_runs)."""
        from clusterddp.schedulers import slurm_runs

        return slurm_runs.refresh(records, env)

    def logs(self, options: SlurmOptions, env: Mapping[str, str]) -> int:
        from clusterddp.schedulers import slurm_runs

        return slurm_runs.logs(str(options.job_id), env, options.follow, options.rank)

    def wrote(self, request: RenderedRequest, path: str) -> None:
        job = request.job
        pyz = launcher_path(job, os.getcwd()) if job.container.enabled else None
        print(f"wrote {path}; submit it with: {by_hand(job, shlex.quote(path), pyz)}")

    def submit(self, request: RenderedRequest, options: SlurmOptions, env: Mapping[str, str]) -> int:
        """Check the secrets named by env_passthrough are set here, then hand the script to sbatch."""
        job = request.job
        passthrough_env(job.env_passthrough, env, job.source or os.path.abspath(str(options.job)), job.env, job.line_of)
        if job.container.enabled and not options.dry_run:
            _ensure_launcher(job)
        job_id = _submit(job, request.text, dry_run=options.dry_run, env=env)
        if job_id is not None:
            self.submitted = Submitted(job_id, "job_id", run_dir=os.path.abspath(os.path.join(job.logs.dir, job_id)),
                                       console=os.path.abspath(batch_log(job, job_id)),
                                       options={"python": options.python} if options.python else {})
        return 0


def _ensure_launcher(job: JobSpec) -> None:
    """The zipapp the script's container runs (``clusterddp pack``), built here when missing:
    the login node has clusterddp, the image need not."""
    path = launcher_path(job, os.getcwd())
    if not os.path.isfile(path):
        size = pack.build(path)
        print(f"clusterddp: wrote the launcher the container runs: {path} ({size} bytes)", file=sys.stderr)


#: What ``submit`` keeps from the caller's SLURM_* variables: the client's own configuration.
KEPT_SLURM_VARS = ("SLURM_CONF",)
#: Prefixes of variables that describe the caller's own allocation or step (or set sbatch's
#: options behind the job file's back). Handed to sbatch they end up in the new job's
#: environment: a leaked SLURM_CPU_BIND has pinned 8 ranks to 4 cores. "SLURM", not
#: "SLURM_": SLURMD_NODENAME (the caller's node) and SLURMRESTD_* are the caller's too.
SCRUBBED_PREFIXES = ("SLURM", "SBATCH_", "SALLOC_", "SRUN_", "PMIX_", "PMI_")


def sbatch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment minus its allocation's variables, for the sbatch process."""
    return {k: v for k, v in env.items() if k in KEPT_SLURM_VARS or not k.startswith(SCRUBBED_PREFIXES)}


def batch_log(job: JobSpec, job_id: str) -> str:
    """The batch shell's log (``#SBATCH --output``) of job ``job_id``."""
    return default_output(job).replace("%x", job.name).replace("%j", job_id)


def _submit(job: JobSpec, script: str, dry_run: bool, env: Mapping[str, str]) -> str | None:
    """Write the script into the log dir (it documents the run), then ``sbatch --parsable`` it;
    the job id (None on a dry run)."""
    log_dir = Path(job.logs.dir)
    path = log_dir / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    command = ["sbatch", "--parsable", str(path)]
    if dry_run:
        sys.stdout.write(script)
        print(f"# dry run: would write {path} and run: {shlex.join(command)}")
        return None
    clean = sbatch_env(env)
    if shutil.which("sbatch", path=clean.get("PATH")) is None:
        raise SubmitError("sbatch is not on PATH", "run this on a SLURM login node, or use 'render' and copy the script")
    try:
        log_dir.mkdir(parents=True, exist_ok=True)  # sbatch does not create the output's directory
    except OSError as exc:
        raise JobSpecError(job.source or "<job>", job.line_of("logs.dir"), "logs.dir",
                           f"cannot create {shown(str(log_dir))}: {exc.strerror}") from None
    write_output(str(path), script)
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=clean)
    if result.returncode != 0:
        sys.stderr.write(scrub(result.stderr))
        raise SubmitError(f"sbatch failed with exit code {result.returncode} (script kept at {path})")
    job_id = result.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"
    output = batch_log(job, job_id)
    print(job_id)
    print(f"clusterddp: submitted job {job_id}; script {path}; batch log {output}; "
          f"worker logs under {job.logs.dir}/{job_id}/", file=sys.stderr)
    return job_id
