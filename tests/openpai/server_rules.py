"""What OpenPAI's REST server checks before it accepts a job, re-implemented for the tests.

1. The JSON schema of ``src/rest-server/src/config/v2/protocol.js`` (data/, run with
   python-jsonschema's Draft7Validator, which agrees with the server's Ajv on every
   conformance case: see test_openpai_rules.py).
2. ``protocolValidate`` in ``src/rest-server/src/middlewares/v2/protocol.js``: prerequisite
   names unique per type, deployment names unique, each task role's ``dockerImage`` /
   ``data`` / ``script`` / ``output`` naming a prerequisite of that type, and
   ``defaults.deployment`` naming a deployment.
3. The FrameworkController ``Framework`` the server makes of the spec (k8s.js
   generateFrameworkDescription / generateTaskRole): ``jobRetryCount`` becomes
   ``spec.retryPolicy.maxRetryCount``, ``instances`` each role's ``taskNumber``, and
   ``taskRetryCount`` the task's ``maxRetryCount`` (only with ``extras.gangAllocation: false``;
   0 otherwise). microsoft/frameworkcontroller pkg/apis/frameworkcontroller/v1 (d6e70787):
   crd.go bounds ``taskNumber`` to 0..10000 and ``maxRetryCount`` to >= -2, and types.go holds
   ``MaxRetryCount`` in an int32, so a larger count is a Framework that never runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

DATA = Path(__file__).resolve().parent / "data"
SCHEMA = json.loads((DATA / "openpai-protocol-v2.schema.json").read_text(encoding="utf-8"))
#: Task-role field -> prerequisite type it must name (protocol.js prerequisiteFields).
PREREQUISITE_FIELDS = {"script": "script", "output": "output", "data": "data", "dockerImage": "dockerimage"}


def schema_errors(job: Any) -> list[str]:
    """Schema violations as ``path: message`` (empty when the schema accepts the job)."""
    validator = jsonschema.Draft7Validator(SCHEMA)
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                  for e in validator.iter_errors(job))


def middleware_errors(job: dict[str, Any]) -> list[str]:
    """protocolValidate's checks after the schema (the server stops at the first; we list all)."""
    errors = []
    prerequisites: dict[str, set[str]] = {kind: set() for kind in PREREQUISITE_FIELDS.values()}
    for item in job.get("prerequisites", []):
        if item["name"] in prerequisites[item["type"]]:
            errors.append(f"Duplicate {item['type']} prerequisites {item['name']}.")
        prerequisites[item["type"]].add(item["name"])
    deployments: set[str] = set()
    for item in job.get("deployments", []):
        if item["name"] in deployments:
            errors.append(f"Duplicate deployments {item['name']}.")
        deployments.add(item["name"])
    for role in job["taskRoles"].values():
        for field, kind in PREREQUISITE_FIELDS.items():
            if field in role and role[field] not in prerequisites[kind]:
                errors.append(f"Prerequisite {role[field]} does not exist.")
    deployment = (job.get("defaults") or {}).get("deployment")
    if deployment is not None and deployment not in deployments:
        errors.append(f"Default deployment {deployment} does not exist.")
    return errors


#: FrameworkController's bounds (crd.go: taskNumber maximum; types.go: int32 retry counts).
MAX_TASK_NUMBER = 10000
MAX_INT32 = (1 << 31) - 1


def framework_errors(job: dict[str, Any]) -> list[str]:
    """What the Framework made of a schema-valid job could not hold (see 3. above)."""
    errors = []
    retries = job.get("jobRetryCount", 0)
    if retries > MAX_INT32:
        errors.append(f"jobRetryCount {retries} does not fit the Framework's int32 maxRetryCount")
    gang = (job.get("extras") or {}).get("gangAllocation") is not False
    for name, role in job["taskRoles"].items():
        if role.get("instances", 1) > MAX_TASK_NUMBER:
            errors.append(f"taskRoles.{name}.instances {role['instances']} is over the Framework's "
                          f"taskNumber maximum {MAX_TASK_NUMBER}")
        task_retries = 0 if gang else role.get("taskRetryCount", 0)
        if not -2 <= task_retries <= MAX_INT32:
            errors.append(f"taskRoles.{name}.taskRetryCount {task_retries} is outside the Framework's "
                          f"maxRetryCount range -2..{MAX_INT32}")
    return errors


def server_errors(text: str) -> list[str]:
    """Everything OpenPAI would reject in this YAML text (empty: it would accept and run it)."""
    job = yaml.safe_load(text)
    errors = schema_errors(job)
    return errors or middleware_errors(job) or framework_errors(job)
