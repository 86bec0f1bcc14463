"""The reference CRDs (shared/reference/kubernetes/crds) as validators for rendered objects.

``shared/`` sits beside the checkout in CI (``<repo>/../shared``); in a worktree further up,
so every ancestor of the checkout is tried. The schema is made strict the way ``kubectl
create`` (field validation ``Strict``) is: an unknown field is an error, not silently pruned.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from tests.conftest import REPO

#: Kind -> its CRD, every one a test cluster needs: the three flavors, and ClusterTrainingRuntime,
#: the kind of the stock ``torch-distributed`` runtime (RUNTIME) a TrainJob names.
CRD_FILES = {
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "JobSet": "jobset.x-k8s.io_jobsets.yaml",
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
}

#: The stock runtime a rendered TrainJob names (kubernetes.runtime's default).
RUNTIME = "torch_distributed.yaml"


def crd_dir() -> Path | None:
    for base in (REPO, *REPO.parents):
        candidate = base / "shared" / "reference" / "kubernetes" / "crds"
        if candidate.is_dir():
            return candidate
    return None


def require_crds() -> Path:
    found = crd_dir()
    if found is None:
        pytest.skip("shared/reference/kubernetes/crds not found beside the checkout (CI puts shared/ at ../shared)")
    return found


_CACHE: dict[str, dict[str, Any]] = {}


def crd(kind: str) -> dict[str, Any]:
    if kind not in _CACHE:
        _CACHE[kind] = yaml.safe_load((require_crds() / CRD_FILES[kind]).read_text(encoding="utf-8"))
    return _CACHE[kind]


def crd_name(kind: str) -> str:
    """The CRD's own name (``trainjobs.trainer.kubeflow.org``), as ``kubectl wait crd/NAME`` takes it."""
    return str(crd(kind)["metadata"]["name"])


def served_schema(kind: str, api_version: str) -> dict[str, Any]:
    """The openAPIV3Schema of the version ``api_version`` names (it must be served)."""
    doc = crd(kind)
    group, _, version = api_version.partition("/")
    assert doc["spec"]["group"] == group, (doc["spec"]["group"], group)
    for entry in doc["spec"]["versions"]:
        if entry["name"] == version:
            assert entry["served"], f"{kind} {version} is not served"
            return dict(entry["schema"]["openAPIV3Schema"])
    raise AssertionError(f"{kind} has no version {version}")


def _strict(node: Any) -> Any:
    """Every object schema with ``properties`` refuses other keys (kubectl's Strict field
    validation), unless it preserves unknown fields."""
    if isinstance(node, dict):
        out = {key: _strict(value) for key, value in node.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(item) for item in node]
    return node


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every place ``obj`` breaks its CRD's schema, as 'path: message' lines."""
    schema = _strict(copy.deepcopy(served_schema(obj["kind"], obj["apiVersion"])))
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def cel_rules(kind: str, api_version: str) -> Iterator[tuple[str, str]]:
    """(schema path, rule) of every ``x-kubernetes-validations`` rule in the served schema."""
    def walk(node: Any, path: str) -> Iterator[tuple[str, str]]:
        if not isinstance(node, dict):
            return
        for rule in node.get("x-kubernetes-validations", ()):
            yield path, rule["rule"]
        for key, child in node.get("properties", {}).items():
            yield from walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}{{}}")
    yield from walk(served_schema(kind, api_version), "")
