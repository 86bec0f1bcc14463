"""The ``kubernetes:`` section: what only a Kubernetes manifest needs (docs/kubernetes.md).

Every name that lands in the manifest is checked here, at load time, against Kubernetes' own
rules (clusterddp.sections.k8s_names), so a bad namespace, label or toleration is one line
``jobs/x.yaml:12: kubernetes.labels: ...`` before anything reaches an API server. The keys of
a toleration are Kubernetes' own (``tolerationSeconds``), so one can be pasted from a pod spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping

from clusterddp.sections import k8s_names as k
from clusterddp.specload import check, check_each
from clusterddp.validate import shown

Flavor = Literal["trainjob", "jobset", "pytorchjob"]
FLAVORS: tuple[str, ...] = ("trainjob", "jobset", "pytorchjob")
#: How the launcher reaches the pod: a ConfigMap rendered beside the object (the image needs
#: python3 and torch only), or the image's own ``clusterddp`` and job file (docs/kubernetes.md).
Launcher = Literal["configmap", "image"]
#: Kueue's label naming the LocalQueue; written from ``queue``, never from ``labels``.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: GPUs per node: more than any node holds is a typo (and Kubernetes' quantities are int64).
MAX_GPUS = 1024
#: A toleration's seconds: Kubernetes keeps them in an int64; a year is plenty.
MAX_TOLERATION_SECONDS = 366 * 24 * 3600
#: What annotations on one object may hold in all (apimachinery's TotalAnnotationSizeLimitB).
MAX_ANNOTATION_BYTES = 256 * 1024


def _extended_resource(value: str) -> str | None:
    """An extended resource name (IsExtendedResourceName): ``domain/name``, outside kubernetes.io."""
    if "/" not in value or value.split("/")[0].endswith("kubernetes.io"):
        return f"must be an extended resource name such as 'nvidia.com/gpu' or 'amd.com/gpu', got {shown(value)}"
    return k.qualified_name_problem(value)


def _gpus(value: int) -> str | None:
    return None if 0 <= value <= MAX_GPUS else f"must be 0-{MAX_GPUS}, got {value}"


def _keys(problem: Callable[[str], str | None]) -> Callable[[Mapping[str, Any]], str | None]:
    """A check over a mapping's keys: the first bad key's problem."""
    def checker(value: Mapping[str, Any]) -> str | None:
        for key in value:
            found = problem(key)
            if found:
                return found
        return None
    return checker


def _labels(value: Mapping[str, str]) -> str | None:
    if QUEUE_LABEL in value:
        return f"{QUEUE_LABEL!r} is written from kubernetes.queue: set 'queue' instead"
    return _keys(k.qualified_name_problem)(value)


def _annotations(value: Mapping[str, str]) -> str | None:
    size = sum(len(key.encode()) + len(text.encode()) for key, text in value.items())
    if size > MAX_ANNOTATION_BYTES:
        return f"annotations hold {size} bytes; Kubernetes allows at most {MAX_ANNOTATION_BYTES} in all"
    return _keys(k.qualified_name_problem)(value)


def _seconds(value: int) -> str | None:
    return None if 0 <= value <= MAX_TOLERATION_SECONDS else f"must be 0-{MAX_TOLERATION_SECONDS}, got {value}"


def _toleration(value: "Toleration") -> str | None:
    """The API server's own rules across a toleration's fields (ValidateTolerations)."""
    if value.operator == "Exists" and value.value:
        return "a toleration with operator 'Exists' takes no 'value'"
    if not value.key and value.operator != "Exists":
        return "a toleration without 'key' must have operator 'Exists' (it then tolerates every taint)"
    if value.tolerationSeconds is not None and value.effect != "NoExecute":
        return "'tolerationSeconds' applies only to effect 'NoExecute'"
    return None


def _optional(problem: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """An empty string means 'not set' for a toleration's key and value, as in a pod spec."""
    return lambda value: None if value == "" else problem(value)


@dataclass(frozen=True)
class Toleration:
    """One pod toleration, with the field names of the Kubernetes API."""

    key: str = field(default="", metadata=check(_optional(k.qualified_name_problem)))
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = field(default="", metadata=check(k.label_value_problem))
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = field(default=None, metadata=check(_seconds))  # noqa: N815 (the API's name)


@dataclass(frozen=True)
class KubernetesSpec:
    """Namespace, queue and pod settings of the rendered object; never holds secrets. The
    image is the job-level ``container.image`` (clusterddp.sections.container).

    Values of ``env_passthrough`` names come from the Secret named ``secret`` (a
    ``secretKeyRef`` per name), never from the job file or the manifest.
    """

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "image": "moved to the job-level 'container: {image: ...}', which every target reads",
    }

    #: Default flavor of ``clusterddp render k8s``; ``--flavor`` overrides it.
    flavor: Flavor = "trainjob"
    #: Object name; default the job's ``name`` (which then must be a DNS-1035 label).
    name: str | None = field(default=None, metadata=check(k.dns1035_label_problem))
    #: None: the kubeconfig context's namespace, as with ``kubectl apply -f``.
    namespace: str | None = field(default=None, metadata=check(k.dns1123_label_problem))
    #: Kueue LocalQueue: written as the label ``kueue.x-k8s.io/queue-name``.
    queue: str | None = field(default=None, metadata=check(k.label_value_problem))
    #: ClusterTrainingRuntime a TrainJob runs on.
    runtime: str = field(default="torch-distributed", metadata=check(k.subdomain_problem))
    #: ``configmap``: the job file and the packed launcher travel in a ConfigMap (the image
    #: needs python3 and torch); ``image``: the image has clusterddp and the job file itself.
    launcher: Launcher = "configmap"
    gpu_resource: str = field(default="nvidia.com/gpu", metadata=check(_extended_resource))
    #: GPUs per node (pod); 0 is a CPU job.
    gpus: int = field(default=0, metadata=check(_gpus))
    #: CPU and memory per node, Kubernetes quantities ('8', '500m', '64Gi'): requests = limits.
    cpu: str | None = field(default=None, metadata=check(k.quantity_problem))
    memory: str | None = field(default=None, metadata=check(k.quantity_problem))
    #: /dev/shm as an in-memory emptyDir of this size (DataLoader workers need more than 64M).
    shm_size: str | None = field(default=None, metadata=check(k.quantity_problem))
    service_account: str | None = field(default=None, metadata=check(k.subdomain_problem))
    node_selector: dict[str, str] = field(default_factory=dict, metadata={
        **check(_keys(k.qualified_name_problem)), **check_each(k.label_value_problem)})
    tolerations: tuple[Toleration, ...] = field(default=(), metadata=check_each(_toleration))
    priority_class: str | None = field(default=None, metadata=check(k.subdomain_problem))
    image_pull_secrets: tuple[str, ...] = field(default=(), metadata=check_each(k.subdomain_problem))
    labels: dict[str, str] = field(default_factory=dict, metadata={
        **check(_labels), **check_each(k.label_value_problem)})
    annotations: dict[str, str] = field(default_factory=dict, metadata=check(_annotations))
    #: Secret whose keys, named like the variables, hold the ``env_passthrough`` values.
    secret: str | None = field(default=None, metadata=check(k.subdomain_problem))
