"""End to end on a real cluster (marked k8s): every flavor of jobs/cifar10.yaml is created in
a fresh namespace, accepted by the server's own validation, read back, stopped, and gone.

The cluster comes from CLUSTERDDP_TEST_KUBECONFIG (skipped, with that reason, when unset); the
CRDs are installed from shared/reference/kubernetes/crds with ``kubectl apply --server-side``
when the server lacks them. docs/kubernetes.md, "Testing on a cluster", says how to run it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from typing import Iterator

import pytest

from clusterddp.schedulers.kubernetes import scheduler as k8s
from tests.conftest import REPO, cli, cli_env
from tests.kubernetes.crds import CRD_FILES, RUNTIME, crd_name, require_crds

pytestmark = pytest.mark.k8s
KUBECONFIG = "CLUSTERDDP_TEST_KUBECONFIG"


def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """kubectl ARGS; with ``check``, a failure fails the test with kubectl's own stderr (a bare
    CalledProcessError hid why a CRD or the runtime was refused)."""
    done = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        pytest.fail(f"kubectl {shlex.join(args)} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """KUBECONFIG for this module's kubectl calls, and the CRDs installed when missing."""
    path = os.environ.get(KUBECONFIG)
    if not path:
        pytest.skip(f"{KUBECONFIG} is not set: no Kubernetes cluster to test against")
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on PATH")
    crds = require_crds()
    saved = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = path
    try:
        for name in CRD_FILES.values():
            kubectl("apply", "--server-side", "-f", str(crds / name))
        for kind in CRD_FILES:  # the runtime's kind must be served before the runtime is applied
            kubectl("wait", "--for=condition=Established", f"crd/{crd_name(kind)}", "--timeout=60s")
        kubectl("apply", "--server-side", "-f", str(crds / RUNTIME))
        yield
    finally:
        if saved is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved


@pytest.fixture
def namespace(cluster: None) -> Iterator[str]:
    """A fresh namespace, deleted afterwards."""
    name = f"clusterddp-test-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl("delete", "namespace", name, "--wait=false", check=False)


def k8s_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m clusterddp ARGS`` of this checkout, against the test cluster."""
    done = cli(*args, env=cli_env(KUBECONFIG=os.environ["KUBECONFIG"], PYTHONPATH=str(REPO)))
    assert done.returncode == 0, (args, done.stderr)
    return done


@pytest.mark.parametrize("flavor", ["trainjob", "jobset", "pytorchjob"])
def test_create_status_stop_leaves_nothing(namespace: str, flavor: str) -> None:
    """Each flavor of jobs/cifar10.yaml: created (the server validates it), its status read,
    stopped, and after that no object, no pod and no launcher ConfigMap of it is left in the namespace."""
    created = k8s_cli("submit", "k8s", "jobs/cifar10.yaml", "--flavor", flavor, "--namespace", namespace).stdout.strip()
    assert created.endswith("/cifar10"), created
    status = k8s_cli("status", "k8s", created, "--namespace", namespace).stdout
    head, _, phase = status.splitlines()[0].partition(": ")
    assert head.endswith("/cifar10") and phase, status
    print(status)
    k8s_cli("stop", "k8s", created, "--namespace", namespace)
    resource = k8s.RESOURCES[flavor]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        left = json.loads(kubectl("get", resource, "-n", namespace, "-o", "json").stdout)["items"]
        pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l", f"{k8s.POD_SELECTORS[flavor]}=cifar10",
                                  "-o", "json").stdout)["items"]
        configmap = kubectl("get", "configmap", "cifar10-clusterddp", "-n", namespace, "--ignore-not-found",
                            "-o", "name").stdout.strip()
        if not left and not pods and not configmap:
            return
        time.sleep(2)
    pytest.fail(f"{flavor} cifar10 still has objects, pods or its ConfigMap in {namespace} 120 s after stop")


def test_server_accepts_every_flavor_on_dry_run(cluster: None) -> None:
    """The server's own validation (schema, CEL, webhooks) accepts every rendered flavor."""
    for flavor in ("trainjob", "jobset", "pytorchjob"):
        manifest = k8s_cli("render", "k8s", "jobs/cifar10.yaml", "--flavor", flavor).stdout
        done = subprocess.run(["kubectl", "create", "--dry-run=server", "-f", "-"], input=manifest,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (flavor, done.stderr)


def test_a_second_submit_names_the_job(namespace: str) -> None:
    """Submitting jobs/cifar10.yaml as a jobset twice: the real server refuses the launcher's
    ConfigMap first; the line names the jobset and how to stop it, and the first job is untouched."""
    created = k8s_cli("submit", "k8s", "jobs/cifar10.yaml", "--flavor", "jobset", "--namespace", namespace).stdout.strip()
    again = cli("submit", "k8s", "jobs/cifar10.yaml", "--flavor", "jobset", "--namespace", namespace,
                env=cli_env(KUBECONFIG=os.environ["KUBECONFIG"], PYTHONPATH=str(REPO)))
    assert (again.returncode, again.stderr) == (
        2, f"clusterddp: error: kubectl: jobset cifar10 already exists in namespace {namespace}: stop it first "
           f"(clusterddp stop k8s {created} --namespace {namespace}), or set kubernetes.name\n")
    assert kubectl("get", "configmap", "cifar10-clusterddp", "-n", namespace, "-o", "name").stdout.strip()
    k8s_cli("stop", "k8s", created, "--namespace", namespace)
