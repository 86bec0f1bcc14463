"""The pods a controller makes of a rendered manifest: their names, labels, annotations, and the
container's command and environment, computed from the manifest the way the controllers and the
kubelet would, so a test runs each "pod" with exactly what a cluster gives it.

Sources (read upstream; the summary is ../shared/reference/kubernetes/README.md):

- JobSet (kubernetes-sigs/jobset, pkg/controllers/jobset_controller.go, pkg/constants): Job
  ``<jobset>-<replicatedJob>-<jobIndex>``; pod labels and annotations
  ``jobset.sigs.k8s.io/jobset-name``, ``.../replicatedjob-name``, ``.../job-index`` and
  ``.../restart-attempt`` (RestartsKey, the set's restart count); ``subdomain`` =
  ``network.subdomain`` (default: the JobSet's name) when ``enableDNSHostnames``.
- Indexed Job (kubernetes pkg/controller/job, batch/v1 JobCompletionIndexAnnotation): pod
  ``i`` gets annotation (and label) ``batch.kubernetes.io/job-completion-index: i``,
  hostname ``<job>-<i>``, and env ``JOB_COMPLETION_INDEX`` in every container.
- TrainJob on ``torch-distributed`` (kubeflow/trainer, plugins/torch/torch.go): a JobSet of
  the TrainJob's name from the runtime's template, replicated job ``node``, container ``node``
  with ``trainer.image``/``command``/``args``/``env``, plus ``PET_NNODES``,
  ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (fieldRef to the completion index),
  ``PET_MASTER_ADDR`` = ``<trainjob>-node-0-0.<trainjob>``, ``PET_MASTER_PORT`` = 29500.
- The kubelet resolves ``valueFrom.fieldRef`` (downward API) and ``secretKeyRef``, and writes
  a ``configMap`` volume's ``items`` (key -> path; ``data`` as UTF-8, ``binaryData`` decoded) as
  files under the container's ``volumeMounts[].mountPath``, and an ``emptyDir`` as an empty
  directory there; the container runtime sets ``HOSTNAME``.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: The torch plugin's port on node 0 (kubeflow/trainer constants.ContainerTrainerPort).
TORCH_PORT = 29500
FIELD_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


@dataclass(frozen=True)
class Pod:
    """One pod as the controllers and the kubelet make it."""

    name: str
    hostname: str
    subdomain: str
    index: int
    labels: dict[str, str]
    annotations: dict[str, str]
    #: The container's command + args, as written in the manifest.
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    #: ConfigMap volumes as the kubelet writes them: mountPath -> {file name: bytes}.
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)
    #: The mountPaths of its disk-backed emptyDir volumes: empty, writable, the pod's own.
    empty_dirs: list[str] = field(default_factory=list)

    @property
    def fqdn(self) -> str:
        """The name the JobSet's headless service gives the pod (``<hostname>.<subdomain>``)."""
        return f"{self.hostname}.{self.subdomain}"


def field_value(path: str, pod: Pod, namespace: str) -> str:
    """A downward-API ``fieldRef`` of ``pod`` (the paths a container env may name)."""
    match = FIELD_PATH.fullmatch(path)
    if match:
        source = pod.labels if match.group(1) == "labels" else pod.annotations
        return source.get(match.group(2), "")
    simple = {"metadata.name": pod.name, "metadata.namespace": namespace}
    if path not in simple:
        raise ValueError(f"fieldRef {path!r} is not resolved by this test's kubelet")
    return simple[path]


def container_env(entries: list[Mapping[str, Any]], pod: Pod, namespace: str,
                  secrets: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The container's ``env`` list as the kubelet resolves it (later entries win, like $(VAR)-free env)."""
    out: dict[str, str] = {}
    for entry in entries:
        source = entry.get("valueFrom")
        if source is None:
            out[entry["name"]] = str(entry.get("value", ""))
        elif "fieldRef" in source:
            out[entry["name"]] = field_value(source["fieldRef"]["fieldPath"], pod, namespace)
        else:
            ref = source["secretKeyRef"]
            out[entry["name"]] = secrets[ref["name"]][ref["key"]]
    return out


def configmap_files(pod_spec: Mapping[str, Any], container: Mapping[str, Any],
                    configmaps: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, bytes]]:
    """The container's configMap volume mounts as files (mountPath -> {path: bytes}), each item's
    key read from the named ConfigMap's ``data`` or ``binaryData``, as the kubelet does."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    out: dict[str, dict[str, bytes]] = {}
    for mount in container.get("volumeMounts", []):
        source = volumes[mount["name"]].get("configMap")
        if source is None:
            continue
        configmap = configmaps[source["name"]]
        data, binary = configmap.get("data") or {}, configmap.get("binaryData") or {}
        items = source.get("items") or [{"key": key, "path": key} for key in (*data, *binary)]
        out[mount["mountPath"]] = {item["path"]: data[item["key"]].encode() if item["key"] in data
                                   else base64.b64decode(binary[item["key"]]) for item in items}
    return out


def empty_dirs(pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    """The container's mountPaths of emptyDir volumes on disk (``medium: Memory`` is /dev/shm,
    which the test's pods share with the host)."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    return [mount["mountPath"] for mount in container.get("volumeMounts", [])
            if "emptyDir" in volumes[mount["name"]] and volumes[mount["name"]]["emptyDir"].get("medium") != "Memory"]


def jobset_pods(manifest: Mapping[str, Any], restart_attempt: int = 0, namespace: str = "default",
                secrets: Mapping[str, Mapping[str, str]] | None = None,
                configmaps: Mapping[str, Mapping[str, Any]] | None = None) -> list[Pod]:
    """Every pod of a rendered JobSet on attempt ``restart_attempt``, in completion-index order."""
    name = manifest["metadata"]["name"]
    network = manifest["spec"].get("network") or {}
    subdomain = network.get("subdomain") or name
    pods = []
    for rjob in manifest["spec"]["replicatedJobs"]:
        for job_index in range(int(rjob.get("replicas", 1))):
            job_spec = rjob["template"]["spec"]
            assert job_spec["completionMode"] == "Indexed" and job_spec["parallelism"] == job_spec["completions"]
            (container,) = job_spec["template"]["spec"]["containers"]
            files = configmap_files(job_spec["template"]["spec"], container, configmaps or {})
            for index in range(int(job_spec["completions"])):
                pod = _indexed_pod(name, rjob["name"], job_index, index, subdomain, restart_attempt,
                                   container, namespace, secrets or {})
                pod.files.update(files)
                pod.empty_dirs.extend(empty_dirs(job_spec["template"]["spec"], container))
                pods.append(pod)
    return pods


def _indexed_pod(jobset: str, rjob: str, job_index: int, index: int, subdomain: str, attempt: int,
                 container: Mapping[str, Any], namespace: str, secrets: Mapping[str, Mapping[str, str]]) -> Pod:
    """Pod ``index`` of Job ``<jobset>-<rjob>-<job_index>``: JobSet's labels, the Job's index, the kubelet's env."""
    job = f"{jobset}-{rjob}-{job_index}"
    marks = {JOBSET_NAME: jobset, REPLICATED_JOB: rjob, JOB_INDEX: str(job_index), RESTART_ATTEMPT: str(attempt),
             COMPLETION_INDEX: str(index)}
    pod = Pod(name=f"{job}-{index}-x{attempt}", hostname=f"{job}-{index}", subdomain=subdomain, index=index,
              labels=dict(marks), annotations=dict(marks),
              argv=[*container.get("command", ()), *container.get("args", ())])
    env = container_env(container.get("env", []), pod, namespace, secrets)
    env["JOB_COMPLETION_INDEX"] = str(index)  # the Job controller, in every container of an Indexed Job
    env["HOSTNAME"] = pod.hostname  # the container runtime
    pod.env.update(env)
    return pod


def trainjob_pods(manifest: Mapping[str, Any], runtime: Mapping[str, Any], restart_attempt: int = 0,
                  namespace: str = "default", secrets: Mapping[str, Mapping[str, str]] | None = None,
                  configmaps: Mapping[str, Mapping[str, Any]] | None = None) -> list[Pod]:
    """Every pod of a rendered TrainJob on the ``runtime`` (a ClusterTrainingRuntime): the JobSet
    the TrainJob controller makes, with the torch plugin's PET_* in container ``node`` and the
    volumes and mounts of its ``runtimePatches``."""
    name = manifest["metadata"]["name"]
    trainer = manifest["spec"]["trainer"]
    nodes = int(trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1)))
    plugin = [{"name": "PET_NNODES", "value": str(nodes)},
              {"name": "PET_NPROC_PER_NODE", "value": proc_per_node(trainer, runtime)},
              {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                  "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
              {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
              {"name": "PET_MASTER_PORT", "value": str(TORCH_PORT)}]
    reserved = {entry["name"] for entry in plugin}
    assert not reserved & {e["name"] for e in trainer.get("env", [])}, "the TrainJob webhook refuses these"
    container = {"name": "node", "image": trainer["image"], "command": trainer.get("command", []),
                 "args": trainer.get("args", []), "env": [*trainer.get("env", []), *plugin]}
    pod_spec: dict[str, Any] = {"containers": [container]}
    for patch in manifest["spec"].get("runtimePatches", []):
        for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            patched = rjob["template"]["spec"]["template"]["spec"]
            pod_spec["volumes"] = [*pod_spec.get("volumes", []), *patched.get("volumes", [])]
            for named in patched.get("containers", []):
                if named["name"] == "node":
                    container["volumeMounts"] = [*container.get("volumeMounts", []), *named.get("volumeMounts", [])]
    jobset = {"metadata": {"name": name}, "spec": {"network": {"enableDNSHostnames": True, "subdomain": name},
              "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
                  "completionMode": "Indexed", "parallelism": nodes, "completions": nodes,
                  "template": {"spec": pod_spec}}}}]}}
    return jobset_pods(jobset, restart_attempt, namespace, secrets, configmaps)


def proc_per_node(trainer: Mapping[str, Any], runtime: Mapping[str, Any]) -> str:
    """PET_NPROC_PER_NODE as the torch plugin computes it: the TrainJob's numProcPerNode, else the
    runtime's (default ``auto``); ``auto`` with a CPU limit and no GPU becomes the CPU count, rounded up."""
    value = trainer.get("numProcPerNode", runtime["spec"]["mlPolicy"].get("torch", {}).get("numProcPerNode", "auto"))
    limits = (trainer.get("resourcesPerNode") or {}).get("limits") or {}
    if value == "auto" and "cpu" in limits and not any(key.endswith("/gpu") for key in limits):
        cpu = str(limits["cpu"])
        return str(math.ceil(int(cpu[:-1]) / 1000) if cpu.endswith("m") else math.ceil(float(cpu)))
    return str(value)
