"""The kubectl boundary: argv built, kubectl's documented JSON and error lines parsed, and the
real subprocess path through a stand-in ``kubectl`` on PATH (tests/kubernetes/fake_kubectl.py)."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from clusterddp.errors import ClusterDDPError
from clusterddp.schedulers import kubernetes as k8s
from clusterddp.schedulers.kubernetes import KubernetesOptions
from tests.conftest import REPO

FAKE = Path(__file__).resolve().parent / "fake_kubectl.py"
JOB = "jobs/cifar10.yaml"


@pytest.fixture
def fake_kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``kubectl`` on PATH that records its calls to the returned log file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(f"#!{sys.executable}\n" + FAKE.read_text(encoding="utf-8"), encoding="utf-8")
    script.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_LOG", str(log))
    monkeypatch.chdir(REPO)
    return log


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def test_submit_pipes_the_manifest_to_kubectl_create(fake_kubectl: Path) -> None:
    """submit runs 'kubectl --context C --namespace N create -f - -o name' with the render on stdin."""
    name = k8s.submit(KubernetesOptions(JOB, context="lab", namespace="team-a"))
    assert name == "trainjob.trainer.kubeflow.org/cifar10"
    (call,) = calls(fake_kubectl)
    assert call["argv"] == ["--context", "lab", "--namespace", "team-a", "create", "-f", "-", "-o", "name"]
    assert "kind: TrainJob" in str(call["stdin"]) and "name: cifar10" in str(call["stdin"])


def test_status_reads_phase_and_each_pod(fake_kubectl: Path) -> None:
    """status: the object's latest true condition and each pod's state, ordered by node rank."""
    status = k8s.status(KubernetesOptions(JOB, flavor="jobset"))
    assert status.lines() == ["TrainJob/cifar10: Created (JobSetCreated)",
                              "  node 0: cifar10-node-0-0-x Running (running)",
                              "  node 1: cifar10-node-0-1-x Running (running)"]
    argvs = [c["argv"] for c in calls(fake_kubectl)]
    assert argvs == [["get", "jobsets.jobset.x-k8s.io", "cifar10", "-o", "json"],
                     ["get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=cifar10", "-o", "json"]]


def test_stop_deletes_the_object(fake_kubectl: Path) -> None:
    """stop: 'kubectl delete <resource> <name>'; the controllers delete what the object owns."""
    assert "deleted" in k8s.stop(KubernetesOptions(JOB, flavor="pytorchjob"))
    assert calls(fake_kubectl)[0]["argv"] == ["delete", "pytorchjobs.kubeflow.org", "cifar10", "--wait=false"]


def test_logs_prefix_each_line_with_the_node_rank(fake_kubectl: Path) -> None:
    """logs: one 'kubectl logs -f POD' per pod, every line prefixed [node R]."""
    out = io.StringIO()
    assert k8s.logs(KubernetesOptions(JOB), out) == 0
    assert sorted(out.getvalue().splitlines()) == ["[node 0] hello from cifar10-node-0-0-x",
                                                  "[node 1] hello from cifar10-node-0-1-x"]


@pytest.mark.parametrize("scenario,fragment", [
    ("unreachable", "cannot reach the API server: The connection to the server localhost:8080 was refused"),
    ("forbidden", 'forbidden: User "alice" cannot create resource "trainjobs"'),
    ("exists", "cifar10 already exists in that namespace"),
    ("nocrd", "the cluster does not know TrainJob: its CRD is not installed"),
    ("nocrd-get", "the cluster does not know trainjobs: its CRD is not installed"),
    ("nonamespace", "namespace nope does not exist"),
])
def test_server_refusals_are_one_line_exit_2(fake_kubectl: Path, scenario: str, fragment: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each documented kubectl failure is one KubectlError line with exit code 2."""
    monkeypatch.setenv("FAKE_KUBECTL_SCENARIO", scenario)
    with pytest.raises(ClusterDDPError) as info:
        k8s.submit(KubernetesOptions(JOB))
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert info.value.exit_code == 2


def test_no_kubectl_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubectl on PATH: one line saying so, exit 2, nothing run."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(REPO)
    with pytest.raises(ClusterDDPError) as info:
        k8s.submit(KubernetesOptions(JOB))
    assert str(info.value).startswith("'kubectl' not found on PATH") and info.value.exit_code == 2


def test_pytorchjob_pod_rank_from_replica_labels() -> None:
    """A PyTorchJob pod's node rank: master 0, worker i is i+1 (training-operator labels)."""
    worker = {"metadata": {"labels": {"training.kubeflow.org/replica-type": "worker",
                                      "training.kubeflow.org/replica-index": "2"}}}
    master = {"metadata": {"labels": {"training.kubeflow.org/replica-type": "master",
                                      "training.kubeflow.org/replica-index": "0"}}}
    assert (k8s.pod_rank(worker), k8s.pod_rank(master)) == (3, 0)


def test_container_states_and_phase_shapes() -> None:
    """Pod container states (waiting, terminated) and a JobSet's restarts read as one line each."""
    waiting = {"status": {"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]}}
    ended = {"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 75, "reason": "Error"}}}]}}
    assert k8s.container_state(waiting) == "waiting: ImagePullBackOff"
    assert k8s.container_state(ended) == "terminated: exit 75 (Error)"
    jobset = {"status": {"restarts": 2, "conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs"}]}}
    assert k8s.object_phase(jobset) == "Failed (FailedJobs), restarts 2"
    assert k8s.object_phase({}) == "Pending"


def test_kubectl_printing_no_json_is_one_line() -> None:
    """Output that is not a JSON object (a proxy's HTML page) is one KubectlError line."""
    with pytest.raises(k8s.KubectlError, match="kubectl printed no JSON"):
        k8s.parse_json("<html>")


def test_render_entry_writes_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Until the CLI is wired: main_render writes the JobSet manifest of jobs/cifar10.yaml to --output."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "cifar10.jobset.yaml"
    assert k8s.main_render(KubernetesOptions(JOB, flavor="jobset", output=str(out))) == 0
    assert "kind: JobSet" in out.read_text(encoding="utf-8")
