"""Rendered specs pass every rule OpenPAI's REST server enforces; the rule checker itself is checked."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from server_rules import DATA, SCHEMA, framework_errors, middleware_errors, schema_errors, server_errors

from clusterddp.schedulers.openpai.render import MAX_INSTANCES, MAX_RETRY_COUNT, render_openpai
from clusterddp.sections.container import ContainerSpec
from clusterddp.sections.openpai import OpenPAISpec
from clusterddp.spec import JobSpec, load_job

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CASES = json.loads((DATA / "openpai-schema-conformance.json").read_text(encoding="utf-8"))["cases"]
#: The example jobs of the repository (globbed now: other jobs may be added at any time) and ours.
JOB_FILES = sorted(REPO.glob("jobs/*.yaml")) + sorted((HERE / "jobs").glob("*.yaml"))
#: Example jobs that do not name an image still must render to a valid spec once they do.
PLACEHOLDER_IMAGE = "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_schema_check_agrees_with_the_servers_validator(case: dict) -> None:
    """Our schema check gives the real upstream Ajv verdict on each conformance case."""
    assert (schema_errors(case["job"]) == []) == case["ajv_valid"]


@pytest.mark.parametrize("path", sorted((DATA / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_upstream_examples_pass(path: Path) -> None:
    """OpenPAI's own example jobs pass the checker (it does not reject real jobs)."""
    assert server_errors(path.read_text(encoding="utf-8")) == []


def test_middleware_rules_catch_bad_references() -> None:
    """Missing or mistyped prerequisite references, duplicates and unknown deployments are caught."""
    job = yaml.safe_load((DATA / "examples" / "cifar10-single-mul-DDP-nccl.yaml").read_text(encoding="utf-8"))
    role = job["taskRoles"]["worker"]
    assert middleware_errors(job) == []
    assert middleware_errors({**job, "prerequisites": []}) == ["Prerequisite docker_image_0 does not exist."]
    assert middleware_errors({**job, "taskRoles": {"worker": {**role, "data": "docker_image_0"}}}) == [
        "Prerequisite docker_image_0 does not exist."]
    assert middleware_errors({**job, "prerequisites": job["prerequisites"] * 2}) == [
        "Duplicate dockerimage prerequisites docker_image_0."]
    assert middleware_errors({**job, "defaults": {"deployment": "prod"}}) == ["Default deployment prod does not exist."]
    without = {k: v for k, v in job.items() if k != "prerequisites"}  # schema-valid: the list is optional
    assert server_errors(yaml.safe_dump(without)) == ["Prerequisite docker_image_0 does not exist."]


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_rendered_example_jobs_pass_the_server_rules(path: Path) -> None:
    """Every example job renders to a spec the REST server accepts, ready for clusterddp run."""
    job = load_job(path)
    if job.container.image is None:
        job = replace(job, container=ContainerSpec(image=PLACEHOLDER_IMAGE))
    relative = os.path.relpath(path, REPO)
    text = render_openpai(job, relative)
    assert server_errors(text) == []
    spec = yaml.safe_load(text)
    role = spec["taskRoles"][job.openpai.task_role]
    assert role["commands"][-1] == f"clusterddp run {relative}"
    assert job.openpai.port_label in role["resourcePerInstance"]["ports"]
    assert spec["extras"]["gangAllocation"] is True and "secrets" not in spec
    assert (spec["jobRetryCount"], role["taskRetryCount"]) == (job.restarts, 0)


def test_retry_fields_are_where_and_what_the_schema_says() -> None:
    """The reference schema puts jobRetryCount at the top (integer >= 0) and taskRetryCount in a
    task role (an integer, no lower bound there): the renderer writes exactly those two keys."""
    role_schema = SCHEMA["properties"]["taskRoles"]["patternProperties"]["^[a-zA-Z_][a-zA-Z0-9_]*$"]
    assert SCHEMA["properties"]["jobRetryCount"] == {"type": "integer", "minimum": 0}
    assert role_schema["properties"]["taskRetryCount"] == {"type": "integer"}
    assert role_schema["properties"]["instances"] == {"type": "integer", "minimum": 1}


def test_framework_rules_catch_what_the_schema_lets_through() -> None:
    """Counts the schema accepts but FrameworkController cannot hold are caught; -5 task retries
    (schema-valid, conformance case taskRetry_neg) matter only without gang allocation."""
    job = yaml.safe_load((DATA / "examples" / "cifar10-single-mul-DDP-nccl.yaml").read_text(encoding="utf-8"))
    role = job["taskRoles"]["worker"]
    assert framework_errors(job) == []
    assert framework_errors({**job, "jobRetryCount": 1 << 31}) == [
        "jobRetryCount 2147483648 does not fit the Framework's int32 maxRetryCount"]
    assert schema_errors({**job, "jobRetryCount": 1 << 31}) == []
    assert framework_errors({**job, "taskRoles": {"worker": {**role, "instances": 10001}}}) == [
        "taskRoles.worker.instances 10001 is over the Framework's taskNumber maximum 10000"]
    negative = {**job, "taskRoles": {"worker": {**role, "taskRetryCount": -5}}}
    assert framework_errors(negative) == []
    assert framework_errors({**negative, "extras": {"gangAllocation": False}}) == [
        "taskRoles.worker.taskRetryCount -5 is outside the Framework's maxRetryCount range -2..2147483647"]


@pytest.mark.parametrize("restarts", [0, 1, 3, MAX_RETRY_COUNT])
@pytest.mark.parametrize("nodes", [1, "2:2", 4, MAX_INSTANCES])
def test_rendered_retry_policy_passes_the_server_rules(restarts: int, nodes: int | str) -> None:
    """Any restarts the renderer accepts, with any fixed node count, gives a spec OpenPAI accepts:
    jobRetryCount = restarts, taskRetryCount 0, instances = the count, gang allocation on."""
    job = JobSpec(name="j", script="t.py", nodes=nodes, restarts=restarts, container=ContainerSpec(image="img:1"))
    text = render_openpai(job, "jobs/j.yaml")
    assert server_errors(text) == []
    spec = yaml.safe_load(text)
    role = spec["taskRoles"]["worker"]
    assert (spec["jobRetryCount"], role["taskRetryCount"]) == (restarts, 0)
    assert role["instances"] == job.node_range[1]
    assert role["completion"] == {"minFailedInstances": 1, "minSucceededInstances": job.node_range[1]}
    assert spec["extras"]["gangAllocation"] is True
