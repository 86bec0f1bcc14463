"""How the launcher and the job file reach a Kubernetes pod: a ConfigMap beside the job object.

An image with python3 and torch but without clusterddp runs the job (issue 18, section 3). The
renderer puts the job file (its text, key ``job.yaml``) and the launcher packed as one zipapp
(clusterddp.pack, ``binaryData`` key ``clusterddp.pyz``) into an immutable ConfigMap named
``<object>-clusterddp``, mounted read-only at MOUNT_PATH in every pod; the job file appears there
under its own file name (so its default ``name`` is the same as here). The pod runs::

    python3 /etc/clusterddp/clusterddp.pyz run /etc/clusterddp/cifar10.yaml --job-dir jobs

in the image's working directory: ``--job-dir`` (the directory of the path given to ``render``)
makes the job file's relative paths (``script: cifar10.py``) start where they start in the
checkout, so the image holds the script at ``jobs/cifar10.py`` as here. The ConfigMap's values
are bounded by the API server (ValidateConfigMap: data and binaryData values together at most
core.MaxSecretSize, 1 MiB; keys ``[-._a-zA-Z0-9]+``); the zipapp is about 280 KB.
"""

from __future__ import annotations

import base64
import posixpath
import re
from typing import Any

from clusterddp import pack
from clusterddp.errors import JobSpecError
from clusterddp.schedulers import quoting as q
from clusterddp.sections import k8s_names
from clusterddp.spec import JobSpec
from clusterddp.validate import MAX_JOB_FILE_BYTES, read_small_file, shown

MOUNT_PATH = "/etc/clusterddp"
JOB_KEY = "job.yaml"
PYZ_KEY = "clusterddp.pyz"
VOLUME = "clusterddp"
SUFFIX = "-clusterddp"
#: The python the pod runs the zipapp with: the image's own.
PYTHON = "python3"
#: What a ConfigMap's data and binaryData values may hold together (corev1 MaxSecretSize).
MAX_BYTES = 1024 * 1024
#: A ConfigMap key (apimachinery IsConfigMapKey), at most 253 characters.
KEY_PATTERN = re.compile(r"[-._a-zA-Z0-9]{1,253}")


def configmap_name(object_name: str) -> str:
    """The ConfigMap of object ``object_name``: ``stop`` derives it the same way."""
    return object_name + SUFFIX


def job_file_name(job_path: str, where: str) -> str:
    """The job file's name inside MOUNT_PATH: its own name (the job's default ``name`` comes from
    it). The kubelet refuses a file name starting with '..' (AtomicWriter), and one the zipapp has."""
    name = posixpath.basename(q.comment_text(job_path, where, "job file path"))
    if not name or name.startswith("..") or name == PYZ_KEY:
        raise q.fail(where, "job file path", f"{shown(name)} cannot be a file of the launcher's ConfigMap",
                     "rename the job file (e.g. train.yaml)")
    return name


def pod_command(job_path: str, where: str) -> list[str]:
    """The container's command: the image's python3 runs the zipapp on the mounted job file."""
    job_dir = posixpath.dirname(q.comment_text(job_path, where, "job file path")) or "."
    return [PYTHON, f"{MOUNT_PATH}/{PYZ_KEY}", "run", f"{MOUNT_PATH}/{job_file_name(job_path, where)}",
            "--job-dir", job_dir]


def volume(object_name: str, job_path: str, where: str) -> dict[str, Any]:
    """The ConfigMap as a volume: ``job.yaml`` appears under the job file's own name."""
    items = [{"key": JOB_KEY, "path": job_file_name(job_path, where)}, {"key": PYZ_KEY, "path": PYZ_KEY}]
    return {"name": VOLUME, "configMap": {"name": configmap_name(object_name), "items": items}}


def volume_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}


def job_text(job: JobSpec, where: str) -> str:
    """The job file's text as loaded (UTF-8, bounded): what the pod's launcher reads."""
    if job.source is None:
        raise q.fail(where, "job file path", "the launcher's ConfigMap needs the job file itself")
    try:
        return read_small_file(job.source, MAX_JOB_FILE_BYTES).decode("utf-8")
    except (OSError, ValueError) as exc:
        raise q.fail(where, "job file path", f"cannot read it again for the ConfigMap: {exc}") from None


def configmap(job: JobSpec, object_name: str, metadata: dict[str, Any], where: str) -> dict[str, Any]:
    """The immutable ConfigMap with the job file and the zipapp; refused over the 1 MiB limit."""
    name = configmap_name(object_name)
    problem = k8s_names.subdomain_problem(name)
    if problem:
        raise JobSpecError(where, job.key_lines.get("kubernetes.name"), "kubernetes.name",
                           f"the launcher's ConfigMap {shown(name)} {problem}")
    text, pyz = job_text(job, where), pack.archive_bytes()
    size = len(text.encode("utf-8")) + len(pyz)
    if size > MAX_BYTES:
        raise q.fail(where, "kubernetes.launcher", f"the job file and the launcher are {size} bytes, over a "
                     f"ConfigMap's {MAX_BYTES}", "set kubernetes.launcher: image and build clusterddp into the image")
    meta = {key: value for key, value in metadata.items() if key in ("namespace", "labels")}
    labels = {k: v for k, v in meta.get("labels", {}).items() if not k.startswith("kueue.x-k8s.io/")}
    meta = {"name": name, **({"namespace": meta["namespace"]} if "namespace" in meta else {}),
            **({"labels": labels} if labels else {})}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "immutable": True,
            "data": {JOB_KEY: text}, "binaryData": {PYZ_KEY: base64.b64encode(pyz).decode("ascii")}}
