"""The container half of the sbatch script: how the srun step enters ``container.image``.

Host side (the batch shell) does everything that needs SLURM's own commands: it expands the
step's node list with ``scontrol`` and exports MASTER_ADDR for each attempt (the port each
launcher derives from the job id, as on bare nodes, unless ``master.port`` fixes it),
and it runs the restarts and the requeue. Inside the container only the launcher runs, from
the single-file zipapp ``clusterddp pack`` builds (mounted read-only), with the image's
``python3``: it never calls ``scontrol`` or ``srun`` (pyxis issue 31: they are not in images).

Per runtime (docs/containers.md):

- pyxis: ``--container-image/-mounts/-workdir``, ``--no-container-mount-home`` and
  ``--container-env`` naming every variable the launcher reads, so an image's ENV (or enroot's
  pytorch hook) cannot override the host's value.
- apptainer: ``apptainer exec --nv --cleanenv --pwd W --bind ... IMAGE``; a host-side shim on
  each node hands exactly the named variables in as ``APPTAINERENV_NAME`` (values are never
  split at ',' as ``--env`` would split them).
- oci: ``srun --container=BUNDLE``; SLURM 22.05 runs one task per node and gives it no
  per-task variables of its own: those it has are the batch shell's (SLURM_NODEID=0 on every
  node), so ``env -u`` clears them and the launcher places itself from the step's node list
  and its host name (clusterddp.envs.slurm). Mounts live in the bundle's config.json.

Before the launcher, ``env -u`` clears the torchrun names (RANK, WORLD_SIZE...) that pyxis or
an image's hook sets for one task per GPU: the launcher sets them for each worker itself.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from clusterddp import __version__
from clusterddp.envs import slurm as slurm_env
from clusterddp.schedulers import quoting as q
from clusterddp.sections.container import SQUASHFS_SUFFIXES, image_problem, parse_mount, path_part_problem
from clusterddp.spec import JobSpec

#: The runtime a SLURM job gets when ``container.runtime`` is not given.
DEFAULT_RUNTIME = "pyxis"
#: The image's interpreter unless the job's ``python`` or ``--python`` says otherwise.
CONTAINER_PYTHON = "python3"
#: SLURM's variables the launcher reads (clusterddp.envs.slurm), plus the ones the batch shell
#: exports and the GPUs SLURM gave the task: each must keep its host value in the container.
LAUNCHER_VARIABLES: tuple[str, ...] = tuple(sorted({
    *slurm_env.JOB_ID, slurm_env.ARRAY_JOB_ID, slurm_env.ARRAY_TASK_ID, slurm_env.STEP_ID, slurm_env.NODE_ID,
    *slurm_env.STEP_NODELIST, *slurm_env.JOB_NODELIST, *slurm_env.STEP_NUM_NODES, *slurm_env.JOB_NUM_NODES,
    slurm_env.STEP_TASKS_PER_NODE, *slurm_env.STEP_NUM_TASKS, slurm_env.GPUS_ON_NODE, slurm_env.CPUS_PER_TASK,
    slurm_env.RESTART_COUNT, slurm_env.NODE_NAME, "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
}))
#: torchrun's per-worker names that pyxis (RANK, LOCAL_RANK) and enroot's pytorch hook
#: (WORLD_SIZE) set for one task per GPU; with one launcher per node they would be wrong.
CLEARED_VARIABLES = ("GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "RANK", "WORLD_SIZE")
#: SLURM's per-task variables. 22.05's OCI support writes only the step's environment into the
#: container, and that is srun's: inherited from the batch shell, which runs on the first node,
#: so SLURM_NODEID=0 and SLURMD_NODENAME=<first node> arrive on every node (found under the
#: test bed: every launcher took node rank 0). Cleared for oci, so the launcher places itself
#: by its host name in SLURM_STEP_NODELIST.
BATCH_TASK_VARIABLES = ("SLURMD_NODENAME", "SLURM_GTIDS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_PROCID",
                        "SLURM_TASK_PID")
#: Apptainer: each named host variable becomes APPTAINERENV_NAME, which --cleanenv keeps.
APPTAINER_SHIM = ('while [ "$1" != -- ]; do if [ -n "${!1+x}" ]; then export "APPTAINERENV_$1=${!1}"; fi; '
                  'shift; done; shift; exec "$@"')


@dataclass(frozen=True)
class ContainerStep:
    """What the template gets: srun options, the launcher's words, and host-side lines."""

    srun_options: tuple[str, ...]
    launcher: tuple[str, ...]
    setup: str
    attempt: str
    #: The launcher's working directory in the container (mounted at its own path): a
    #: relative ``logs.dir`` starts there.
    workdir: str
    #: The zipapp the container runs (``clusterddp pack -o`` it before a hand-run sbatch).
    pyz: str


def default_launcher(workdir: str) -> str:
    """Where the script looks for the zipapp when ``container.launcher`` is not given."""
    return f"{workdir.rstrip('/')}/.clusterddp/clusterddp-{__version__}.pyz"


def launcher_path(job: JobSpec, workdir: str) -> str:
    """The zipapp the script's container runs: ``container.launcher``, else the default under
    the container's working directory (``container.workdir``, else ``workdir``, where the job
    is rendered or submitted). The script, ``submit`` (which builds it) and the hint that names
    ``clusterddp pack`` all ask here."""
    spec = job.container
    work = spec.workdir if spec.workdir is not None else workdir
    return os.path.normpath(spec.launcher if spec.launcher is not None else default_launcher(work))


def container_step(job: JobSpec, job_path: str, where: str, python: str | None, workdir: str | None) -> ContainerStep:
    """The container parts of the script for ``job`` (which has ``container.image``)."""
    spec = job.container
    runtime = spec.runtime or DEFAULT_RUNTIME
    image = _image(spec.image, runtime, where)
    job_dir = _absolute(os.path.dirname(job_path), where, "job file path",
                        "render from the job's directory with an absolute path (submit does)")
    work = spec.workdir if spec.workdir is not None else workdir
    if work is None:
        raise q.fail(where, "container.workdir", "required: the container's working directory",
                     "set container.workdir to an absolute path on the shared file system")
    work = _absolute(work, where, "container.workdir")
    pyz = _absolute(launcher_path(job, work), where, "container.launcher")
    names = sorted({*LAUNCHER_VARIABLES, *job.env, *job.env_passthrough, *spec.env})
    for index, name in enumerate(spec.env):
        q.env_name(name, where, f"container.env[{index}]")
    interpreter = q.shell_word(python or job.python or CONTAINER_PYTHON, where, "python")
    inner = ["env", *(f"-u {n}" for n in CLEARED_VARIABLES if n not in names),
             interpreter, shlex.quote(pyz), "run", shlex.quote(job_path)]
    if runtime == "oci":
        if spec.mounts:
            raise q.fail(where, "container.mounts", "SLURM's OCI runtime takes mounts from the bundle's config.json",
                         "add them to the bundle's 'mounts' (docs/containers.md)")
        options = [shlex.quote(f"--container={image}")]
        stale = [f"-u {n}" for n in BATCH_TASK_VARIABLES if n not in job.env and n not in spec.env]
        inner = ["env", f"--chdir={shlex.quote(work)}", *inner[1:-4], *stale, *inner[-4:]]
        launcher = inner
    else:
        mounts = _mounts(job, where, job_dir, work, pyz)
        if runtime == "pyxis":
            options = [shlex.quote(f"--container-image={image}"), shlex.quote(f"--container-mounts={mounts}"),
                       shlex.quote(f"--container-workdir={work}"),
                       "--container-mount-home" if spec.mount_home else "--no-container-mount-home",
                       shlex.quote("--container-env=" + ",".join(names))]
            launcher = inner
        else:
            options = []
            home = [] if spec.mount_home else ["--no-home"]
            launcher = ["/bin/bash", "-c", shlex.quote(APPTAINER_SHIM), "clusterddp-apptainer", *names, "--",
                        "apptainer", "exec", "--nv", "--cleanenv", *home, f"--pwd={shlex.quote(work)}",
                        shlex.quote(f"--bind={mounts}"), shlex.quote(image), *inner]
    return ContainerStep(tuple(options), tuple(launcher), _setup(job, runtime, pyz), _attempt(job), work, pyz)


def _image(image: str | None, runtime: str, where: str) -> str:
    problem = image_problem(image) if isinstance(image, str) else "is not a string"
    if problem:
        raise q.fail(where, "container.image", problem)
    assert image is not None
    if runtime == "oci":
        found = path_part_problem(image, "an OCI bundle")
        if found:
            raise q.fail(where, "container.image", found, "runtime oci takes the bundle directory's absolute path")
    if runtime == "pyxis" and image.endswith(SQUASHFS_SUFFIXES) and not image.startswith(("/", "./")):
        raise q.fail(where, "container.image", f"pyxis reads {image!r} as a registry image, not a file",
                     f"write './{image}' or an absolute path (pyxis issue 127)")
    return image


def _absolute(path: str, where: str, key: str, hint: str | None = None) -> str:
    problem = path_part_problem(path, "the path") if isinstance(path, str) else "is not a string"
    if problem:
        raise q.fail(where, key, problem, hint)
    return os.path.normpath(path)


def _mounts(job: JobSpec, where: str, job_dir: str, work: str, pyz: str) -> str:
    """The user's mounts, then the job's directory, the working directory, an absolute
    ``logs.dir`` (the launcher writes its rank logs and its records there: docs/slurm.md, "Did
    every launcher start?") and the zipapp's directory at their own paths (left out when a
    mount already shows them there). A relative logs.dir is under the working directory."""
    entries, shown_at_own_path = [], []
    for index, mount in enumerate(job.container.mounts):
        try:
            host, target, flag = parse_mount(mount)
        except ValueError as exc:
            raise q.fail(where, f"container.mounts[{index}]", str(exc)) from None
        entries.append(mount)
        if host == target:
            shown_at_own_path.append(host)
    own = [(job_dir, ""), (work, ""), (os.path.dirname(pyz), ":ro")]
    if os.path.isabs(job.logs.dir):
        own.append((_absolute(job.logs.dir, where, "logs.dir"), ""))
    for path, flag in sorted(own, key=lambda p: len(p[0])):
        if any(path == seen or path.startswith(seen.rstrip("/") + "/") for seen in shown_at_own_path):
            continue
        entries.append(f"{path}:{path}{flag}")
        shown_at_own_path.append(path)
    return ",".join(entries)


def _setup(job: JobSpec, runtime: str, pyz: str) -> str:
    lines = [f"# container ({runtime}): the launcher travels as one file (clusterddp pack); the image needs python3 only.\n",
             f"launcher_pyz={shlex.quote(pyz)}\n",
             'if [ ! -f "$launcher_pyz" ]; then\n',
             '    echo "clusterddp: $launcher_pyz is missing: build it with \'clusterddp pack -o $launcher_pyz\'" >&2\n',
             "    exit 2\n",
             "fi\n"]
    if job.master.addr:
        lines.append(f"export MASTER_ADDR={shlex.quote(job.master.addr)}\n")
    if job.master.port:
        lines.append(f"export MASTER_PORT={q.integer(job.master.port, '<job>', 'master.port', 1, 65535)}\n")
    # Without master.port every launcher derives the same port from the job id it is handed
    # (SLURM_JOB_ID, SLURM_ARRAY_*: clusterddp.envs.slurm), as on bare nodes: nothing to export.
    return "".join(lines)


def _attempt(job: JobSpec) -> str:
    """Per attempt, host side: the master is the first node of this step (the script expanded
    the step's nodes into ``step_hosts`` with scontrol, which is here)."""
    if job.master.addr:
        return ""
    return '    [ -z "${step_hosts[0]-}" ] || export MASTER_ADDR=${step_hosts[0]}\n'
