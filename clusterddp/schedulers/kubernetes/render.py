"""Job file -> one Kubernetes object (TrainJob, JobSet or PyTorchJob): a pure function.

The object is built as Python data and written with ``yaml.safe_dump``: no value is ever
pasted into YAML text, so no value (``"a\\nkind: Pod"`` included) can change the manifest's
structure. Names were checked at load time (clusterddp.sections.kubernetes); the rules that
need the whole job (the flavor, ``nodes``, ``restarts``, GPUs) are checked here, naming the key.

What the pod runs (clusterddp.schedulers.kubernetes.launcher): by default the image's python3
runs the launcher packed as one zipapp, from a ConfigMap rendered before the object (the image
needs python3 and torch, not clusterddp); with ``kubernetes.launcher: image``, the image's own
``clusterddp run JOB_PATH``. Either way in the image's working directory (``container.workdir``
where the flavor has the field), which holds the script at its path relative to the checkout.
The image is ``container.image`` (clusterddp.schedulers.kubernetes.container). Each pod is placed by what its controller gives it: a
TrainJob pod by the torch plugin's ``PET_*`` (the renderer sets none: the webhook refuses
them); a JobSet pod by the ``CLUSTERDDP_JOBSET_*`` contract of clusterddp.envs.jobset, written
here, plus the Job controller's ``JOB_COMPLETION_INDEX``; a PyTorchJob pod by the operator's
``MASTER_ADDR``/``RANK``. Rank 0 is ``<name>-node-0-0.<name>`` (TrainJob, JobSet) or
``<name>-master-0`` (PyTorchJob). docs/kubernetes.md, "Inside the pod".
"""

from __future__ import annotations

from typing import Any

import yaml

from clusterddp import __version__
from clusterddp.envs import jobset as contract
from clusterddp.errors import JobSpecError
from clusterddp.exitcodes import NOT_RESTARTED
from clusterddp.schedulers.kubernetes import container as kc
from clusterddp.schedulers.kubernetes import launcher
from clusterddp.schedulers import quoting as q
from clusterddp.sections import k8s_names
from clusterddp.sections.kubernetes import FLAVORS, QUEUE_LABEL
from clusterddp.spec import JobSpec, LogsSpec
from clusterddp.validate import shown

TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
PYTORCHJOB_API = "kubeflow.org/v1"
#: Replicated job and container of the stock torch-distributed runtime (and of our JobSet).
NODE = "node"
#: torchrun's port on rank 0: the torch plugin's ContainerTrainerPort, used for JobSet too.
MASTER_PORT = 29500
#: The pod label (and annotation) JobSet writes its restart count into, 0 on the first attempt
#: (kubernetes-sigs/jobset pkg/constants RestartsKey); a downward-API fieldRef reads it.
RESTART_ATTEMPT = f"metadata.labels['{contract.RESTART_ATTEMPT_LABEL}']"
#: The launcher's ``--restart-count`` variable: the workers' TORCHELASTIC_RESTART_COUNT.
RESTART_COUNT = "CLUSTERDDP_RESTART_COUNT"
#: Names the controllers or this renderer set in the pod (the TrainJob webhook refuses PET_*).
RESERVED_ENV = frozenset({"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                          "PET_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                          contract.COMPLETION_INDEX, "PYTHONUNBUFFERED", contract.MASTER_ADDR, contract.NNODES,
                          contract.MASTER_PORT, RESTART_COUNT})
#: The Job failure reason a podFailurePolicy FailJob action gives (batch/v1 JobReasonPodFailurePolicy).
POD_FAILURE_POLICY_REASON = "PodFailurePolicy"
#: ``runtimePatches[].manager`` of the patch this renderer writes.
PATCH_MANAGER = "clusterddp"
SHM_VOLUME = "dshm"
#: The launcher's writable directory in every pod, for its logs and run files (``logs.dir``):
#: an emptyDir, as the image's working directory is often read-only (``readOnlyRootFilesystem``,
#: a root-owned WORKDIR) and the launcher refuses a log directory it cannot write. Used when the
#: job file sets no ``logs.dir`` of its own (one it sets is where the user wants the logs).
LOGS_VOLUME = "clusterddp-logs"
LOGS_PATH = "/var/log/clusterddp"


def render_manifest(job: JobSpec, job_path: str, flavor: str | None = None) -> dict[str, Any]:
    """The object for ``flavor`` (default ``kubernetes.flavor``) as plain data."""
    return _object(job, job_path, flavor)[0]


def render_objects(job: JobSpec, job_path: str, flavor: str | None = None) -> list[dict[str, Any]]:
    """What ``kubectl create`` gets, in order: the launcher's ConfigMap (unless
    ``kubernetes.launcher: image``), then the object for ``flavor``."""
    obj, where = _object(job, job_path, flavor)
    if job.kubernetes.launcher == "image":
        return [obj]
    try:
        return [launcher.configmap(job, obj["metadata"]["name"], obj["metadata"], where), obj]
    except JobSpecError as exc:
        raise job.placed(exc) from None


def _object(job: JobSpec, job_path: str, flavor: str | None) -> tuple[dict[str, Any], str]:
    """The TrainJob, JobSet or PyTorchJob, and where errors say they come from."""
    where = q.place(job.source, job_path)
    flavor = flavor or job.kubernetes.flavor
    if flavor not in FLAVORS:
        raise q.fail(where, "kubernetes.flavor", f"unknown flavor {shown(flavor)}; known: {', '.join(FLAVORS)}")
    try:
        name = object_name(job, where, flavor)
        pod = PodParts(job, job_path, where, name, flavor)
        builder = {"trainjob": _trainjob, "jobset": _jobset, "pytorchjob": _pytorchjob}[flavor]
        return builder(job, pod, name, where), where
    except JobSpecError as exc:  # a check made here names the key; the job knows its line
        raise job.placed(exc) from None


def render_kubernetes(job: JobSpec, job_path: str, flavor: str | None = None) -> str:
    """The manifest as a YAML stream (one document per object), after one comment line saying
    where it came from."""
    header, documents = render_documents(job, job_path, flavor)
    return header + "".join(text for _, text in documents)


def render_documents(job: JobSpec, job_path: str, flavor: str | None = None) -> tuple[str, list[tuple[str, str]]]:
    """The header comment line, and each object as (``kind/name`` as kubectl deletes it, its
    YAML document): ``submit`` creates them one by one, so it can undo a half-done create."""
    where = q.place(job.source, job_path)
    header = f"# Rendered by clusterddp {__version__} from {q.comment_text(job_path, where, 'job file path')}: " \
             "kubectl create -f <this file>\n"
    documents = []
    for obj in render_objects(job, job_path, flavor):
        text = yaml.dump(obj, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False, allow_unicode=False,
                         width=1 << 16, explicit_start=True)
        documents.append((f"{obj['kind'].lower()}/{obj['metadata']['name']}", text))
    return header, documents


class _PlainDumper(yaml.SafeDumper):
    """SafeDumper without anchors: a part used twice (the PyTorchJob pod template) is written
    out twice, as a reader of the manifest expects, not as ``&id001`` / ``*id001``. A
    ConfigMap's multi-line text (the job file) is a literal block, readable as the file was.
    Every other string is plain only where ``quoting.yaml_plain`` says every reader takes it
    for a string, else double-quoted: SafeDumper asks only its own YAML 1.1 resolver, so a
    label ``0o17`` or ``1e3`` went out plain and kubectl read a number."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_str(self, data: str) -> yaml.ScalarNode:
        if "\n" in data:
            return self.represent_scalar("tag:yaml.org,2002:str", data, style="|")
        return self.represent_scalar("tag:yaml.org,2002:str", data, style=None if q.yaml_plain(data) else '"')


_PlainDumper.add_representer(str, _PlainDumper.represent_str)


def object_name(job: JobSpec, where: str, flavor: str) -> str:
    """``kubernetes.name`` or the job's ``name``: a DNS-1035 label short enough that every pod
    name and hostname the controllers derive from it stays within 63 characters."""
    spec = job.kubernetes
    key = "kubernetes.name" if spec.name else "name"
    name = spec.name or job.name
    problem = k8s_names.dns1035_label_problem(name) if isinstance(name, str) else "is not a string"
    if problem:
        raise JobSpecError(where, job.key_lines.get(key), key, problem, "set kubernetes.name to a Kubernetes name")
    _, high = q.node_range(job, where)
    longest = f"-{NODE}-0-{high - 1}" if flavor != "pytorchjob" else f"-worker-{max(high - 2, 0)}"
    if len(name) + len(longest) > k8s_names.LABEL_MAX:
        raise JobSpecError(where, job.key_lines.get(key), key,
                           f"{shown(name)} is too long: pod hostnames like {name}{longest} must fit in 63 characters",
                           "set a shorter kubernetes.name")
    return name


class PodParts:
    """What every flavor puts in the pod: image, command, env, resources, volumes, pod settings."""

    def __init__(self, job: JobSpec, job_path: str, where: str, name: str, flavor: str) -> None:
        spec = job.kubernetes
        self.where = where
        self.image = kc.pod_image(job, where)
        kc.refuse_host_settings(job, where)
        self.workdir = kc.working_dir(job, where, flavor)
        self.env = secret_env(job, where)
        self.resources = resources(job, where)
        self.volumes: list[dict[str, Any]] = []
        self.mounts: list[dict[str, Any]] = []
        if spec.shm_size:
            self.volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}})
            self.mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
        if spec.launcher == "image":
            self.command = ["clusterddp", "run", q.comment_text(job_path, where, "job file path")]
        else:
            self.command = launcher.pod_command(job_path, where)
            self.volumes.append(launcher.volume(name, job_path, where))
            self.mounts.append(launcher.volume_mount())
        if job.logs.dir == LogsSpec().dir and "logs.dir" not in job.key_lines:
            self.command += ["--log-dir", LOGS_PATH]
            self.volumes.append({"name": LOGS_VOLUME, "emptyDir": {}})
            self.mounts.append({"name": LOGS_VOLUME, "mountPath": LOGS_PATH})

    def pod_settings(self, job: JobSpec, priority: bool = True) -> dict[str, Any]:
        """serviceAccountName, nodeSelector, tolerations, imagePullSecrets, volumes (set ones only)."""
        spec = job.kubernetes
        out: dict[str, Any] = {}
        if spec.service_account:
            out["serviceAccountName"] = spec.service_account
        if spec.node_selector:
            out["nodeSelector"] = dict(spec.node_selector)
        if spec.tolerations:
            out["tolerations"] = [{k: v for k, v in vars(t).items() if v not in (None, "")} for t in spec.tolerations]
        if spec.image_pull_secrets:
            out["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
        if priority and spec.priority_class:
            out["priorityClassName"] = spec.priority_class
        if self.volumes:
            out["volumes"] = self.volumes
        return out

    def container(self, name: str, env: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "image": self.image, "command": self.command}
        if self.workdir:
            out["workingDir"] = self.workdir
        if env or self.env:
            out["env"] = [*env, *self.env]
        if self.resources:
            out["resources"] = self.resources
        if self.mounts:
            out["volumeMounts"] = self.mounts
        return out


def metadata(job: JobSpec, name: str) -> dict[str, Any]:
    spec = job.kubernetes
    out: dict[str, Any] = {"name": name}
    if spec.namespace:
        out["namespace"] = spec.namespace
    labels = dict(spec.labels)
    if spec.queue:
        labels[QUEUE_LABEL] = spec.queue
    if labels:
        out["labels"] = labels
    if spec.annotations:
        out["annotations"] = dict(spec.annotations)
    return out


def secret_env(job: JobSpec, where: str) -> list[dict[str, Any]]:
    """``env_passthrough`` names as ``secretKeyRef``s into ``kubernetes.secret``: the manifest
    names where each value is, never the value."""
    names = job.env_passthrough
    if not names:
        return []
    secret = job.kubernetes.secret
    if not secret:
        raise JobSpecError(where, job.key_lines.get("env_passthrough"), "env_passthrough",
                           "on Kubernetes the values come from a Secret, and kubernetes.secret names none",
                           "add 'kubernetes: {secret: <name>}' with one key per variable")
    for index, name in enumerate(names):
        problem = k8s_names.env_var_name_problem(name) or k8s_names.secret_key_problem(name)
        if name in RESERVED_ENV or name.startswith("PET_"):
            problem = "is set by the controller in every pod (the TrainJob webhook refuses PET_* names)"
        if problem:
            raise JobSpecError(where, job.key_lines.get("env_passthrough"), f"env_passthrough[{index}]",
                               f"{shown(name)} {problem}" if not problem.startswith("must") else problem)
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}} for name in names]


def resources(job: JobSpec, where: str) -> dict[str, Any]:
    """Requests = limits for cpu and memory (what the job was sized for); GPUs as limits,
    which Kubernetes copies to requests. A GPU job without GPUs is refused."""
    spec = job.kubernetes
    gpus = spec.gpus
    q.integer(gpus, where, "kubernetes.gpus")
    nproc = job.nproc_per_node
    # The line: kubernetes.gpus where the file sets it, else the key it contradicts.
    if gpus == 0 and (job.backend == "nccl" or nproc == "gpu"):
        cause = "backend" if job.backend == "nccl" else "nproc_per_node"
        why = "backend is nccl" if job.backend == "nccl" else "nproc_per_node is 'gpu'"
        raise JobSpecError(where, job.key_lines.get("kubernetes.gpus") or job.line_of(cause), "kubernetes.gpus",
                           f"is 0 but the {why}", "set kubernetes.gpus to the GPUs per node")
    if gpus > 0 and isinstance(nproc, int) and nproc > gpus and job.backend != "gloo":
        raise JobSpecError(where, job.key_lines.get("kubernetes.gpus") or job.line_of("nproc_per_node"),
                           "kubernetes.gpus", f"{gpus} GPUs per node for nproc_per_node {nproc}: one GPU per worker",
                           f"set kubernetes.gpus to {nproc}, or nproc_per_node to {gpus}")
    sized = {key: value for key, value in (("cpu", spec.cpu), ("memory", spec.memory)) if value}
    limits: dict[str, Any] = dict(sized)
    if gpus:
        limits[spec.gpu_resource] = str(gpus)
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if sized:
        out["requests"] = dict(sized)
    return out


def fixed_nodes(job: JobSpec, where: str, flavor: str, why: str) -> int:
    """``nodes`` as one count; ``"MIN:MAX"`` with MIN < MAX is refused with ``why``."""
    low, high = q.node_range(job, where)
    if low != high:
        raise JobSpecError(where, job.key_lines.get("nodes"), "nodes",
                           f"{shown(job.nodes)}: a {flavor} has no elastic node count ({why})",
                           f"write nodes: {high}, or run the elastic job over SSH with a hostfile")
    return high


def _no_restarts(job: JobSpec, where: str, flavor: str, why: str, hint: str) -> None:
    if job.restarts:
        raise JobSpecError(where, job.key_lines.get("restarts"), "restarts",
                           f"{job.restarts} on a {flavor}: {why}", hint)


def _trainjob(job: JobSpec, pod: PodParts, name: str, where: str) -> dict[str, Any]:
    spec = job.kubernetes
    nodes = fixed_nodes(job, where, "TrainJob", "kubeflow/trainer#2903")
    _no_restarts(job, where, "TrainJob", "restarts belong to the runtime (its JobSet failurePolicy); "
                 "a TrainJob has no restart field", "use --flavor jobset for whole-job restarts, or set them in the runtime")
    if spec.priority_class:
        raise JobSpecError(where, job.key_lines.get("kubernetes.priority_class"), "kubernetes.priority_class",
                           "a TrainJob cannot set a pod's priorityClassName (runtimePatches do not allow it)",
                           "set it in the runtime, use Kueue's label kueue.x-k8s.io/priority-class, or --flavor jobset")
    trainer: dict[str, Any] = {"image": pod.image, "command": pod.command, "numNodes": nodes}
    if isinstance(job.nproc_per_node, int):
        trainer["numProcPerNode"] = job.nproc_per_node
    if pod.resources:
        trainer["resourcesPerNode"] = pod.resources
    if pod.env:
        trainer["env"] = pod.env  # secrets by name only: the torch plugin sets PET_*
    body: dict[str, Any] = {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                           "name": spec.runtime}, "trainer": trainer}
    patch = pod.pod_settings(job, priority=False)
    if pod.mounts:
        patch["containers"] = [{"name": NODE, "volumeMounts": pod.mounts}]
    if patch:
        template = {"spec": {"replicatedJobs": [{"name": NODE, "template": {"spec": {"template": {"spec": patch}}}}]}}
        body["runtimePatches"] = [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": template}}]
    return {"apiVersion": TRAINJOB_API, "kind": "TrainJob", "metadata": metadata(job, name), "spec": body}


def _field_ref(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def jobset_env(name: str, nodes: int) -> list[dict[str, Any]]:
    """The contract of clusterddp.envs.jobset: where node 0 is (its stable name through the
    JobSet's headless service ``<jobset>-node-0-0.<subdomain>``), how many nodes, the port, and
    the restart attempt from the pod's label; the node rank is the Job controller's
    ``JOB_COMPLETION_INDEX``. No ``PET_*``: ``clusterddp env`` in the pod says ``jobset``."""
    return [{"name": contract.MASTER_ADDR, "value": f"{name}-{NODE}-0-0.{name}"},
            {"name": contract.NNODES, "value": str(nodes)},
            {"name": contract.MASTER_PORT, "value": str(MASTER_PORT)},
            {"name": RESTART_COUNT, "valueFrom": _field_ref(RESTART_ATTEMPT)}]


def _jobset(job: JobSpec, pod: PodParts, name: str, where: str) -> dict[str, Any]:
    nodes = fixed_nodes(job, where, "JobSet", "its Indexed Job runs exactly completions pods")
    restarts = q.integer(job.restarts, where, "restarts", maximum=(1 << 31) - 1)
    container = pod.container(NODE, jobset_env(name, nodes))
    container["ports"] = [{"containerPort": MASTER_PORT}]
    never = sorted(NOT_RESTARTED)
    job_spec = {
        "parallelism": nodes, "completions": nodes, "completionMode": "Indexed", "backoffLimit": 0,
        # A node exiting 65 (non-finite loss) or 75 (preempted) fails its Job with reason
        # PodFailurePolicy; the JobSet rule below fails the whole set on that reason.
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": NODE, "operator": "In", "values": never}}]},
        "template": {"spec": {"restartPolicy": "Never", "containers": [container], **pod.pod_settings(job)}},
    }
    rule = {"name": "doNotRestartExit" + "_".join(map(str, never)), "action": "FailJobSet",
            "onJobFailureReasons": [POD_FAILURE_POLICY_REASON]}
    body = {"network": {"enableDNSHostnames": True, "subdomain": name},
            "failurePolicy": {"maxRestarts": int(restarts), "rules": [rule]},
            "replicatedJobs": [{"name": NODE, "replicas": 1, "template": {"spec": job_spec}}]}
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": metadata(job, name), "spec": body}


def _pytorchjob(job: JobSpec, pod: PodParts, name: str, where: str) -> dict[str, Any]:
    nodes = fixed_nodes(job, where, "PyTorchJob", "clusterddp places PyTorchJob pods without an elasticPolicy")
    _no_restarts(job, where, "PyTorchJob", "its operator restarts pods one by one, and a pod restarted "
                 "alone cannot rejoin the others (kubeflow/trainer#2000)", "use --flavor jobset for whole-job restarts")
    template = {"spec": {"containers": [pod.container("pytorch", [])],
                         **pod.pod_settings(job)}}
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, "restartPolicy": "Never", "template": template}
    body = {"nprocPerNode": str(job.nproc_per_node), "runPolicy": {"backoffLimit": 0}, "pytorchReplicaSpecs": replicas}
    return {"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob", "metadata": metadata(job, name), "spec": body}
