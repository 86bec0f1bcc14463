"""The job's ``container:`` section on Kubernetes, where every pod is an image (docs/kubernetes.md).

- ``image`` is the pod's image. Kubernetes pulls it from a registry, so a file or a bundle
  directory (SLURM's squashfs, SIF, OCI bundle) is refused; enroot's ``REGISTRY#IMAGE`` (pyxis)
  is written ``REGISTRY/IMAGE`` and Apptainer's ``docker://IMAGE`` is ``IMAGE``, so one job
  file serves SLURM and Kubernetes.
- ``runtime`` says how SLURM runs the image; on Kubernetes the node's container runtime runs
  every pod, so it is ignored (default or not), as are ``launcher`` (a path on SLURM's shared
  file system; here the launcher travels in a ConfigMap).
- ``workdir`` is the container's ``workingDir`` (JobSet, PyTorchJob); a TrainJob has no field
  for it, so it is refused there.
- ``mounts`` (host paths), ``mount_home`` and ``env`` (host variables) name the host a SLURM
  step runs on; a pod has no such host (a hostPath volume is node-local and refused by the
  baseline Pod Security Standard): refused in one line pointing at Kubernetes' own ways.
"""

from __future__ import annotations

from clusterddp.errors import JobSpecError
from clusterddp.sections.container import SQUASHFS_SUFFIXES
from clusterddp.sections.openpai import docker_image_problem
from clusterddp.spec import JobSpec
from clusterddp.validate import shown

#: Files an image is given as on SLURM (pyxis squashfs, Apptainer SIF).
FILE_SUFFIXES = (*SQUASHFS_SUFFIXES, ".sif")


def _fail(job: JobSpec, where: str, key: str, problem: str, hint: str | None = None) -> JobSpecError:
    return JobSpecError(where, job.key_lines.get(key), key, problem, hint)


def pod_image(job: JobSpec, where: str) -> str:
    """``container.image`` as a registry reference a kubelet pulls; one line when it is not one."""
    image = job.container.image
    if not image:
        line = job.key_lines.get("container") or job.key_lines.get("kubernetes")
        raise JobSpecError(where, line, "container.image", "required to render a Kubernetes job",
                           "add 'container: {image: <image with python3 and torch>}'")
    if image.startswith(("/", "./", "~")) or image.endswith(FILE_SUFFIXES):
        raise _fail(job, where, "container.image", f"{shown(image)} is a file or directory: Kubernetes pulls "
                    "images from a registry", "push the image to a registry and name it (registry/name:tag)")
    reference = image.removeprefix("docker://")
    if "#" in reference:
        registry, _, rest = reference.partition("#")
        if "@" in registry:
            raise _fail(job, where, "container.image", f"{shown(image)} names a registry user (enroot's USER@)",
                        "pods pull with kubernetes.image_pull_secrets")
        reference = f"{registry}/{rest}"
    problem = docker_image_problem(reference)
    if problem:
        raise _fail(job, where, "container.image", f"{problem}: a pod's image is a registry reference")
    return reference


def working_dir(job: JobSpec, where: str, flavor: str) -> str | None:
    """``container.workdir`` for the container's ``workingDir``; a TrainJob cannot set it."""
    workdir = job.container.workdir
    if workdir is not None and flavor == "trainjob":
        raise _fail(job, where, "container.workdir", "a TrainJob cannot set the container's workingDir "
                    "(neither trainer nor runtimePatches has the field)",
                    "set WORKDIR in the image, or use --flavor jobset")
    return workdir


def refuse_host_settings(job: JobSpec, where: str) -> None:
    """``mounts``, ``mount_home`` and ``env`` name the SLURM node's host; a pod has none."""
    spec = job.container
    if spec.mounts:
        raise _fail(job, where, "container.mounts", "host paths do not reach a Kubernetes pod (a hostPath volume "
                    "is node-local and refused by the baseline Pod Security Standard)",
                    "give the pods the data through a volume (PersistentVolumeClaim) in the runtime or the image")
    if spec.mount_home:
        raise _fail(job, where, "container.mount_home", "a pod has no host home directory to mount",
                    "remove it for Kubernetes")
    if spec.env:
        raise _fail(job, where, "container.env", "a pod gets no host environment to pass on",
                    "write fixed values in the job's 'env:', secrets as env_passthrough with kubernetes.secret")
