"""Rendering a job file as a TrainJob, a JobSet or a PyTorchJob: golden files, the reference
CRDs' schemas and CEL rules, the rules the renderer adds, and refusals."""

from __future__ import annotations

import base64
import difflib
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterddp import __version__, pack
from clusterddp.errors import JobSpecError
from clusterddp.exitcodes import NONFINITE_LOSS, PREEMPTED
from clusterddp.schedulers.kubernetes.render import render_kubernetes, render_manifest, render_objects
from clusterddp.sections import k8s_names
from clusterddp.sections.container import ContainerSpec
from clusterddp.sections.kubernetes import FLAVORS
from clusterddp.spec import JobSpec, load_job
from tests.conftest import REPO
from tests.kubernetes.crds import CRD_FILES, RUNTIME, cel_rules, require_crds, schema_errors, served_schema

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
REGENERATE = "CLUSTERDDP_REGEN_GOLDEN"
IMAGE = "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"
FIXTURES = ["minimal", "full"]
EXAMPLES = sorted(p.name for p in (REPO / "jobs").glob("*.yaml"))


def fixture(name: str) -> tuple[JobSpec, str]:
    path = HERE / "jobs" / f"{name}.yaml"
    return load_job(path), os.path.relpath(path, REPO)


def example(name: str) -> JobSpec:
    """An example job; one without a container image is given one (the least a render needs)."""
    job = load_job(REPO / "jobs" / name)
    if job.container.image is None:
        job = replace(job, container=replace(job.container, image=IMAGE))
    return job


def manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for flavor in FLAVORS:
        for name in FIXTURES:
            job, path = fixture(name)
            out.append((f"{name}-{flavor}", render_manifest(job, path, flavor)))
        for name in EXAMPLES:
            out.append((f"jobs/{name}-{flavor}", render_manifest(example(name), f"jobs/{name}", flavor)))
    return out


RENDERED = manifests()
IDS = [case for case, _ in RENDERED]


@pytest.mark.parametrize("name", [*FIXTURES, "cifar10"])
@pytest.mark.parametrize("flavor", FLAVORS)
def test_golden_file(name: str, flavor: str) -> None:
    """The rendered manifest is byte-for-byte the reviewed golden file."""
    job, path = (load_job(REPO / "jobs" / "cifar10.yaml"), "jobs/cifar10.yaml") if name == "cifar10" else fixture(name)
    got = render_kubernetes(job, path, flavor).replace(f"clusterddp {__version__} ", "clusterddp VERSION ")
    got = got.replace(base64.b64encode(pack.archive_bytes()).decode(), "PYZ")  # checked whole by test_configmap_*
    golden = GOLDEN / f"{name}.{flavor}.yaml"
    if os.environ.get(REGENERATE):
        golden.write_text(got, encoding="utf-8")
    want = golden.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(golden), "rendered"))
        pytest.fail(f"{golden.name} differs from the rendered manifest:\n{diff}\n"
                    f"if the change is intended: {REGENERATE}=1 pytest {Path(__file__).name}, then review the diff")


@pytest.mark.parametrize("case,obj", RENDERED, ids=IDS)
def test_validates_against_crd_schema(case: str, obj: dict[str, Any]) -> None:
    """Every flavor of every example job and fixture passes its CRD's openAPIV3Schema, with
    unknown fields refused as kubectl's Strict field validation refuses them."""
    assert schema_errors(obj) == []


def test_schema_check_catches_a_wrong_field() -> None:
    """The strict schema check fails on an unknown field and on a wrong type (it is no no-op)."""
    job, path = fixture("minimal")
    obj = render_manifest(job, path, "trainjob")
    obj["spec"]["trainer"]["numNodes"] = "2"
    obj["spec"]["trainer"]["gpus"] = 1
    errors = schema_errors(obj)
    assert any("numNodes" in e and "integer" in e for e in errors), errors
    assert any("gpus" in e for e in errors), errors


def test_every_kind_the_test_cluster_needs_has_its_crd() -> None:
    """CRD_FILES (what the k8s tests install) holds every CRD of the reference set, the runtime's
    kind among them, each file defining the kind it is listed under (a fresh cluster needs all)."""
    crds = require_crds()
    defined = {}
    for path in sorted(crds.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                defined[doc["spec"]["names"]["kind"]] = path.name
    assert CRD_FILES == defined
    runtime = yaml.safe_load((crds / RUNTIME).read_text(encoding="utf-8"))
    assert schema_errors(runtime) == [] and served_schema(runtime["kind"], runtime["apiVersion"])


#: Every CEL rule of the served schemas, and why it holds for a rendered object on create.
#: Transition rules (``oldSelf``) run only on update; the renderer only creates.
HANDLED_RULES = {
    "TrainJob": {
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": "test_trainjob_name_is_rfc1035",
        "size(self.metadata.name) <= 63": "test_trainjob_name_is_rfc1035",
        "self.trainer.numProcPerNode >= 1": "test_numprocpernode_at_least_one",
        "self >= 1": "test_numprocpernode_at_least_one",
        "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']": "never set: managedBy",
        "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": "never set: initializer",
        "has(self.lastUpdatedTime)": "status: written by the controller",
    },
    "JobSet": {
        "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
        "self.replicatedJobs.exists(x, has(x.dependsOn)))": "test_jobset_sets_neither_startup_policy_nor_depends_on",
        "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)":
            "never set: volumeClaimPolicies",
    },
    "PyTorchJob": {},
}
API = {"TrainJob": "trainer.kubeflow.org/v1alpha1", "JobSet": "jobset.x-k8s.io/v1alpha2", "PyTorchJob": "kubeflow.org/v1"}


@pytest.mark.parametrize("kind", sorted(API))
def test_every_cel_rule_is_accounted_for(kind: str) -> None:
    """Each x-kubernetes-validations rule of the CRD is a transition rule or one named above,
    so a CRD update that adds a rule fails here until a test checks it."""
    rules = [rule for _, rule in cel_rules(kind, API[kind])]
    assert rules, kind
    unknown = [rule for rule in rules if "oldSelf" not in rule and rule not in HANDLED_RULES[kind]]
    assert unknown == []


def _objects(kind: str) -> list[dict[str, Any]]:
    return [obj for _, obj in RENDERED if obj["kind"] == kind]


def test_trainjob_name_is_rfc1035() -> None:
    """CEL 'metadata.name must match RFC 1035 DNS label format' and '<= 63': every TrainJob."""
    for obj in _objects("TrainJob"):
        name = obj["metadata"]["name"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name


def test_numprocpernode_at_least_one() -> None:
    """CEL 'numProcPerNode must be greater than or equal to 1': set only from an integer >= 1."""
    seen = [obj["spec"]["trainer"].get("numProcPerNode") for obj in _objects("TrainJob")]
    assert 4 in seen and None in seen
    assert all(value is None or value >= 1 for value in seen)


def test_jobset_sets_neither_startup_policy_nor_depends_on() -> None:
    """CEL 'StartupPolicy and DependsOn APIs are mutually exclusive': neither is written."""
    for obj in _objects("JobSet"):
        assert "startupPolicy" not in obj["spec"]
        assert all("dependsOn" not in job for job in obj["spec"]["replicatedJobs"])


def test_jobset_pod_failure_policy_follows_the_job_api_rules() -> None:
    """batch/v1's own rules for podFailurePolicy: pods restartPolicy Never, onExitCodes never
    lists 0, its containerName is a container of the pod; the JobSet rule name matches its regex."""
    for obj in _objects("JobSet"):
        job = obj["spec"]["replicatedJobs"][0]["template"]["spec"]
        pod = job["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        codes = job["podFailurePolicy"]["rules"][0]["onExitCodes"]
        assert 0 not in codes["values"] and codes["values"] == sorted(set(codes["values"]))
        assert codes["containerName"] in [c["name"] for c in pod["containers"]]
        for rule in obj["spec"]["failurePolicy"]["rules"]:
            assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]), rule["name"]


def test_jobset_restarts_and_exit_codes_that_never_restart() -> None:
    """restarts: N is failurePolicy.maxRestarts N; exits 65 and 75 fail the Job through its
    podFailurePolicy (reason PodFailurePolicy) and the JobSet rule fails the set on that reason."""
    job, path = fixture("minimal")
    obj = render_manifest(replace(job, restarts=3), path, "jobset")
    policy = obj["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 3
    assert policy["rules"] == [{"name": "doNotRestartExit65_75", "action": "FailJobSet",
                                "onJobFailureReasons": ["PodFailurePolicy"]}]
    spec = obj["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert spec["podFailurePolicy"]["rules"][0] == {"action": "FailJob", "onExitCodes": {
        "containerName": "node", "operator": "In", "values": [NONFINITE_LOSS, PREEMPTED]}}
    assert (spec["parallelism"], spec["completions"], spec["completionMode"]) == (2, 2, "Indexed")
    assert obj["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "hello"}


def test_jobset_pod_says_where_node_zero_is() -> None:
    """A JobSet pod gets exactly clusterddp.envs.jobset's contract: node 0 is
    <jobset>-node-0-0.<subdomain>, N nodes, port 29500, and the restart attempt from JobSet's
    pod label (jobset pkg/constants RestartsKey) as CLUSTERDDP_RESTART_COUNT; no PET_*."""
    job, path = fixture("minimal")
    obj = render_manifest(job, path, "jobset")
    env = {e["name"]: e for e in obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert list(env) == ["CLUSTERDDP_JOBSET_MASTER_ADDR", "CLUSTERDDP_JOBSET_NNODES", "CLUSTERDDP_JOBSET_MASTER_PORT",
                         "CLUSTERDDP_RESTART_COUNT"]
    assert env["CLUSTERDDP_JOBSET_MASTER_ADDR"]["value"] == "hello-node-0-0.hello"
    assert env["CLUSTERDDP_JOBSET_NNODES"]["value"] == "2" and env["CLUSTERDDP_JOBSET_MASTER_PORT"]["value"] == "29500"
    assert env["CLUSTERDDP_RESTART_COUNT"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"


@pytest.mark.parametrize("flavor", FLAVORS)
def test_passthrough_names_are_secret_references(flavor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """env_passthrough names become secretKeyRefs into kubernetes.secret; no value appears."""
    job, path = fixture("full")
    monkeypatch.setenv("WANDB_API_KEY", "sk-live-do-not-print")
    text = render_kubernetes(job, path, flavor)
    assert "sk-live-do-not-print" not in text
    refs = re.findall(r"secretKeyRef:\n\s+name: (\S+)\n\s+key: (\S+)", text)
    pods = 2 if flavor == "pytorchjob" else 1  # Master and Worker templates
    assert refs == [("training-secrets", "WANDB_API_KEY"), ("training-secrets", "HF_TOKEN")] * pods


def test_trainjob_sets_no_reserved_env() -> None:
    """The TrainJob webhook refuses PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
    PET_MASTER_ADDR, PET_MASTER_PORT in trainer.env: none is ever written."""
    reserved = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
    for obj in _objects("TrainJob"):
        assert not reserved & {e["name"] for e in obj["spec"]["trainer"].get("env", [])}


def test_trainjob_pod_settings_go_through_runtime_patches() -> None:
    """Service account, node selector, tolerations, pull secrets and /dev/shm reach the
    runtime's 'node' container through runtimePatches, the only place a TrainJob takes them."""
    job, path = fixture("full")
    obj = render_manifest(job, path, "trainjob")
    patch = obj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    assert patch["name"] == "node" and pod["serviceAccountName"] == "trainer"
    assert pod["containers"] == [{"name": "node", "volumeMounts": [
        {"name": "dshm", "mountPath": "/dev/shm"}, {"name": "clusterddp", "mountPath": "/etc/clusterddp", "readOnly": True},
        {"name": "clusterddp-logs", "mountPath": "/var/log/clusterddp"}]}]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}},
                              {"name": "clusterddp", "configMap": {"name": "resnet-ddp-clusterddp", "items": [
                                  {"key": "job.yaml", "path": "full.yaml"}, {"key": "clusterddp.pyz", "path": "clusterddp.pyz"}]}},
                              {"name": "clusterddp-logs", "emptyDir": {}}]
    assert pod["tolerations"][1] == {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute",
                                     "tolerationSeconds": 300}
    assert obj["spec"]["trainer"]["resourcesPerNode"]["limits"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4"}
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-high"


def test_pytorchjob_master_and_workers() -> None:
    """A PyTorchJob has one Master and nodes-1 Workers, each container named 'pytorch'."""
    job, path = fixture("full")
    spec = render_manifest(job, path, "pytorchjob")["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 3)
    for role in replicas.values():
        assert [c["name"] for c in role["template"]["spec"]["containers"]] == ["pytorch"]
    assert spec["nprocPerNode"] == "4"


def test_hostile_annotation_stays_a_value() -> None:
    """A value that looks like YAML structure ('...\\nkind: Pod') reads back as the same string."""
    job, path = fixture("full")
    for flavor in FLAVORS:
        docs = list(yaml.safe_load_all(render_kubernetes(job, path, flavor)))
        assert [d["kind"] for d in docs][0] == "ConfigMap" and len(docs) == 2
        assert docs[1]["metadata"]["annotations"] == {"example.com/owner": "vision team\nkind: Pod"}


def _refusal(job: JobSpec, flavor: str) -> str:
    with pytest.raises(JobSpecError) as info:
        render_manifest(job, "jobs/x.yaml", flavor)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("flavor", ["trainjob", "jobset", "pytorchjob"])
def test_elastic_nodes_refused(flavor: str) -> None:
    """nodes: "MIN:MAX" is one line naming 'nodes' for every flavor."""
    job, _ = fixture("minimal")
    assert "nodes: '2:4': a " in _refusal(replace(job, nodes="2:4"), flavor)


def test_restarts_on_trainjob_explained() -> None:
    """restarts on a TrainJob: one line saying restarts belong to the runtime."""
    job, _ = fixture("minimal")
    assert "restarts: 2 on a TrainJob: restarts belong to the runtime" in _refusal(replace(job, restarts=2), "trainjob")


def test_missing_image_secret_and_bad_name_refused() -> None:
    """No image, passthrough without a Secret, a job name that is no DNS-1035 label, a
    GPU job without GPUs: one line each naming the key."""
    job, _ = fixture("minimal")
    assert "container.image: required" in _refusal(replace(job, container=ContainerSpec()), "jobset")
    assert "env_passthrough: on Kubernetes" in _refusal(replace(job, env_passthrough=("HF_TOKEN",)), "jobset")
    assert "env_passthrough[0]: 'PET_NNODES' is set by the controller" in _refusal(
        replace(job, env_passthrough=("PET_NNODES",), kubernetes=replace(job.kubernetes, secret="s")), "trainjob")
    assert "name: must be a DNS-1035 label" in _refusal(replace(job, name="Hello_World"), "trainjob")
    assert "kubernetes.gpus: is 0 but the backend is nccl" in _refusal(replace(job, backend="nccl"), "pytorchjob")
    assert "too long" in _refusal(replace(job, name="a" * 60), "jobset")


def test_name_rules_match_kubernetes_examples() -> None:
    """The name checks accept and refuse what apimachinery's validation tests do."""
    assert k8s_names.subdomain_problem("a.b-c.d") is None and k8s_names.subdomain_problem("a..b")
    assert k8s_names.dns1123_label_problem("0abc") is None and k8s_names.dns1035_label_problem("0abc")
    assert k8s_names.qualified_name_problem("example.com/My_Name.1") is None
    assert k8s_names.qualified_name_problem("/name") and k8s_names.qualified_name_problem("a/" + "b" * 64)
    assert k8s_names.label_value_problem("") is None and k8s_names.label_value_problem("-a")
    assert k8s_names.quantity_problem("1.5Gi") is None and k8s_names.quantity_problem("1e3") is None
    assert k8s_names.quantity_problem("0.0") and k8s_names.quantity_problem("1GB")


def _container(**fields: Any) -> JobSpec:
    job, _ = fixture("minimal")
    return replace(job, container=replace(job.container, **fields))


@pytest.mark.parametrize("image,want", [
    ("nvcr.io#nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3"),
    ("docker://pytorch/pytorch:2.4.0", "pytorch/pytorch:2.4.0"),
    ("registry.example:5000/team/torch@sha256:" + "a" * 64, "registry.example:5000/team/torch@sha256:" + "a" * 64),
])
def test_container_image_is_the_pods_image(image: str, want: str) -> None:
    """container.image is every flavor's image; pyxis's REGISTRY#IMAGE and Apptainer's docker://
    are written as the registry reference a kubelet pulls; container.runtime changes nothing."""
    for runtime in (None, "pyxis", "apptainer"):
        job = _container(image=image, runtime=runtime)
        assert render_manifest(job, "jobs/x.yaml", "trainjob")["spec"]["trainer"]["image"] == want
        pod = render_manifest(job, "jobs/x.yaml", "jobset")["spec"]["replicatedJobs"][0]["template"]["spec"]
        assert pod["template"]["spec"]["containers"][0]["image"] == want


@pytest.mark.parametrize("fields,fragment", [
    ({"image": "/shared/bundles/torch", "runtime": "oci"}, "container.image: '/shared/bundles/torch' is a file or"),
    ({"image": "./torch.sqsh"}, "container.image: './torch.sqsh' is a file or directory"),
    ({"image": "images/torch.sif", "runtime": "apptainer"}, "is a file or directory: Kubernetes pulls"),
    ({"image": "alice@nvcr.io#nvidia/pytorch:24.05"}, "names a registry user"),
    ({"mounts": ("/datasets:/data:ro",)}, "container.mounts: host paths do not reach a Kubernetes pod"),
    ({"mount_home": True}, "container.mount_home: a pod has no host home"),
    ({"env": ("NCCL_DEBUG",)}, "container.env: a pod gets no host environment"),
])
def test_host_side_container_settings_refused(fields: dict[str, Any], fragment: str) -> None:
    """What names SLURM's host (a file image, host mounts, home, host variables): one line naming the key."""
    assert fragment in _refusal(_container(**fields), "jobset")


def test_workdir_is_the_working_directory() -> None:
    """container.workdir is the container's workingDir for JobSet and PyTorchJob; a TrainJob has
    no field for it and is refused in one line."""
    job = _container(workdir="/workspace/project")
    pod = render_manifest(job, "jobs/x.yaml", "jobset")["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert pod["template"]["spec"]["containers"][0]["workingDir"] == "/workspace/project"
    master = render_manifest(job, "jobs/x.yaml", "pytorchjob")["spec"]["pytorchReplicaSpecs"]["Master"]
    assert master["template"]["spec"]["containers"][0]["workingDir"] == "/workspace/project"
    assert "container.workdir: a TrainJob cannot set the container's workingDir" in _refusal(job, "trainjob")


#: ConfigMap keys (apimachinery IsConfigMapKey) and the API server's 1 MiB on the values (ValidateConfigMap).
CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")


@pytest.mark.parametrize("name", [*FIXTURES, "cifar10"])
@pytest.mark.parametrize("flavor", FLAVORS)
def test_configmap_holds_the_job_file_and_the_packed_launcher(name: str, flavor: str) -> None:
    """The first document is a v1 ConfigMap the API server accepts (keys [-._a-zA-Z0-9]+, values
    within 1 MiB, a DNS-1123 name): the job file's text and exactly pack's zipapp; the pod mounts
    it read-only and its command runs that zipapp on that file."""
    job, path = (load_job(REPO / "jobs" / "cifar10.yaml"), "jobs/cifar10.yaml") if name == "cifar10" else fixture(name)
    configmap, obj = render_objects(job, path, flavor)
    assert (configmap["apiVersion"], configmap["kind"], configmap["immutable"]) == ("v1", "ConfigMap", True)
    assert set(configmap) == {"apiVersion", "kind", "metadata", "immutable", "data", "binaryData"}
    assert k8s_names.subdomain_problem(configmap["metadata"]["name"]) is None
    assert configmap["metadata"].get("namespace") == obj["metadata"].get("namespace")
    keys = [*configmap["data"], *configmap["binaryData"]]
    assert keys == ["job.yaml", "clusterddp.pyz"] and all(CONFIGMAP_KEY.fullmatch(k) and len(k) <= 253 for k in keys)
    pyz = base64.b64decode(configmap["binaryData"]["clusterddp.pyz"], validate=True)
    assert pyz == pack.archive_bytes() and configmap["data"]["job.yaml"] == Path(str(job.source)).read_text()
    assert len(pyz) + len(configmap["data"]["job.yaml"].encode()) <= 1024 * 1024
    text = yaml.safe_dump(obj)
    assert f"name: {configmap['metadata']['name']}" in text and "mountPath: /etc/clusterddp\n" in text
    assert "readOnly: true" in text
    command = obj["spec"]["trainer"]["command"] if flavor == "trainjob" else re.findall(r"command:\n((?:\s+- .*\n)+)", text)
    assert "/etc/clusterddp/clusterddp.pyz" in str(command) and f"/etc/clusterddp/{Path(path).name}" in str(command)


def test_render_is_deterministic() -> None:
    """Two renders are byte-identical, and so are two packs built from scratch (no cache)."""
    job, path = fixture("full")
    assert render_kubernetes(job, path, "jobset") == render_kubernetes(job, path, "jobset")
    assert pack.archive_bytes.__wrapped__() == pack.archive_bytes.__wrapped__()


def test_configmap_over_one_mib_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launcher that would not fit a ConfigMap's 1 MiB is one line naming kubernetes.launcher."""
    monkeypatch.setattr(pack, "archive_bytes", lambda: b"x" * (1024 * 1024))
    job, _ = fixture("minimal")
    with pytest.raises(JobSpecError) as info:
        render_objects(job, "jobs/x.yaml", "jobset")
    assert "kubernetes.launcher: the job file and the launcher are " in str(info.value)
    assert "over a ConfigMap's 1048576" in str(info.value) and "\n" not in str(info.value)


def test_launcher_image_renders_one_object() -> None:
    """kubernetes.launcher: image: no ConfigMap, the image's own 'clusterddp run JOB_PATH', no volume of ours
    but the launcher's logs emptyDir."""
    job, path = fixture("minimal")
    job = replace(job, kubernetes=replace(job.kubernetes, launcher="image"))
    (obj,) = render_objects(job, path, "trainjob")
    assert obj["spec"]["trainer"]["command"] == ["clusterddp", "run", path, "--log-dir", "/var/log/clusterddp"]
    patched = obj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patched["template"]["spec"]["template"]["spec"]["volumes"] == [{"name": "clusterddp-logs", "emptyDir": {}}]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_launcher_logs_go_to_an_empty_dir_unless_the_job_sets_logs_dir(flavor: str, tmp_path: Path) -> None:
    """Without logs.dir the pod's launcher writes its logs and run files in an emptyDir
    (--log-dir /var/log/clusterddp): the working directory may be read-only. A logs.dir the job
    file sets is kept, and no emptyDir is added."""
    job, path = fixture("minimal")
    for objects, wanted in ((render_objects(job, path, flavor), True),
                            (render_objects(replace(job, key_lines={"logs.dir": 3}), path, flavor), False)):
        text = yaml.safe_dump(objects[-1])
        assert ("--log-dir" in text and "clusterddp-logs" in text and "emptyDir: {}" in text) == wanted, text
