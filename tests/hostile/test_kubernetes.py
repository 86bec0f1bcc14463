"""Hostile values in every key of the ``kubernetes:`` section: each is one JobSpecError line
naming file:line and the key, and nothing a value holds can change a rendered manifest's
structure (issue 20: the hostile suite grows with the new fields)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from clusterddp.errors import JobSpecError
from clusterddp.schedulers.kubernetes.render import render_manifest
from clusterddp.sections.kubernetes import FLAVORS
from clusterddp.spec import load_job
from tests.conftest import REPO

SCRIPT = f"script: {REPO / 'jobs' / 'hello.py'}\n"
INJECTION = "a\nkind: Pod"
HOSTILE = {"empty": "", "huge": "a" * 70000, "nul": "a\x00b", "newline": "a\nb", "injection": INJECTION,
           "negative": "-1", "esc": "a\x1b[2Jb", "u2028": "a\u2028b", "space": "a b", "upper": "A"}
#: String keys whose every hostile value above is refused (names, quantities).
NAME_KEYS = ["name", "namespace", "runtime", "gpu_resource", "service_account", "priority_class", "secret",
             "cpu", "memory", "shm_size"]
#: Keys that take a list of names or a mapping: the hostile text as an item, a key or a value.
LIST_KEYS = ["image_pull_secrets"]
MAP_KEY_KEYS = ["node_selector", "labels", "annotations"]
MAP_VALUE_KEYS = ["node_selector", "labels"]
TOLERATION_KEYS = ["key", "value"]
#: Non-strings and out-of-range numbers.
EXPLICIT = [
    ("gpus-negative", "{gpus: -1}", "kubernetes.gpus", "must be 0-1024"),
    ("gpus-huge", "{gpus: 100000000000}", "kubernetes.gpus", "must be 0-1024"),
    ("gpus-string", "{gpus: two}", "kubernetes.gpus", "expected an integer"),
    ("flavor-unknown", "{flavor: volcano}", "kubernetes.flavor", "expected one of"),
    ("queue-long", "{queue: " + "q" * 64 + "}", "kubernetes.queue", "at most 63"),
    ("queue-slash", "{queue: a/b}", "kubernetes.queue", "label value"),
    ("labels-queue", "{labels: {kueue.x-k8s.io/queue-name: q}}", "kubernetes.labels", "set 'queue'"),
    ("label-value-long", "{labels: {a: " + "v" * 64 + "}}", "kubernetes.labels.a", "at most 63"),
    ("annotations-huge", "{annotations: {a: " + "v" * 300000 + "}}", "kubernetes.annotations.a", "characters long"),
    ("toleration-op", "{tolerations: [{key: a, operator: In}]}", "kubernetes.tolerations[0].operator", "expected one of"),
    ("toleration-effect", "{tolerations: [{key: a, effect: Never}]}", "kubernetes.tolerations[0].effect", "expected one of"),
    ("toleration-exists-value", "{tolerations: [{key: a, operator: Exists, value: b}]}", "kubernetes.tolerations[0]",
     "takes no 'value'"),
    ("toleration-no-key", "{tolerations: [{value: b}]}", "kubernetes.tolerations[0]", "without 'key'"),
    ("toleration-seconds", "{tolerations: [{key: a, tolerationSeconds: 5}]}", "kubernetes.tolerations[0]", "NoExecute"),
    ("toleration-seconds-negative", "{tolerations: [{key: a, effect: NoExecute, tolerationSeconds: -5}]}",
     "kubernetes.tolerations[0].tolerationSeconds", "must be 0-"),
    ("toleration-unknown", "{tolerations: [{key: a, seconds: 5}]}", "kubernetes.tolerations[0].seconds", "unknown key"),
    ("tolerations-not-list", "{tolerations: {key: a}}", "kubernetes.tolerations", "expected a list"),
    ("unknown-key", "{namepsace: x}", "kubernetes.namepsace", "did you mean 'namespace'"),
    ("cpu-zero", "{cpu: 0}", "kubernetes.cpu", "more than zero"),
    ("memory-unit", "{memory: 8GB}", "kubernetes.memory", "quantity"),
    ("name-digit", "{name: 1job}", "kubernetes.name", "DNS-1035"),
    ("image-moved", "{image: 'a:1'}", "kubernetes.image", "moved to the job-level 'container: {image"),
    ("launcher-unknown", "{launcher: pip}", "kubernetes.launcher", "expected one of"),
]


def _cases() -> list[tuple[str, str, str, str]]:
    """(id, the kubernetes section as one flow line, key named, fragment); the error is on line 2."""
    cases = []
    for label, value in HOSTILE.items():
        text = json.dumps(value)
        for key in NAME_KEYS:
            cases.append((f"{key}-{label}", f"{{{key}: {text}}}", f"kubernetes.{key}", ""))
        for key in LIST_KEYS:
            cases.append((f"{key}-{label}", f"{{{key}: [{text}]}}", f"kubernetes.{key}[0]", ""))
        if label not in ("negative", "upper", "space"):  # label keys may be upper case, '-1' is one too
            key_text = json.dumps("a" * 300) if label == "huge" else text  # YAML keys: at most 1024 characters
            for key in MAP_KEY_KEYS:
                cases.append((f"{key}-key-{label}", f"{{{key}: {{{key_text}: x}}}}", f"kubernetes.{key}", ""))
        if label not in ("empty", "upper"):  # an empty label value is valid, and so is 'A'
            for key in MAP_VALUE_KEYS:
                cases.append((f"{key}-value-{label}", f"{{{key}: {{k: {text}}}}}", f"kubernetes.{key}.k", ""))
            for key in TOLERATION_KEYS:
                cases.append((f"toleration-{key}-{label}", f"{{tolerations: [{{{key}: {text}, operator: Equal}}]}}",
                              f"kubernetes.tolerations[0].{key}", ""))
    cases.extend(EXPLICIT)
    return [case for case in cases if not (case[0].startswith("toleration-value-") and case[0].endswith("-negative"))]


CASES = _cases()


@pytest.mark.parametrize("section,key,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_value_is_one_line_naming_the_key(section: str, key: str, fragment: str) -> None:
    """A hostile kubernetes.* value is one JobSpecError line: the file, line 2 and the key."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(SCRIPT + f"kubernetes: {section}\n", encoding="utf-8")
        with pytest.raises(JobSpecError) as info:
            load_job(path)
    message = str(info.value)
    assert "\n" not in message and len(message) < 1200, message[:300]
    assert message.startswith(f"{path}:2: {key}"), message[:300]
    assert fragment in message


def test_table_covers_every_key() -> None:
    """Every key of the kubernetes section is in the hostile table (a new key needs its rows)."""
    import dataclasses

    from clusterddp.sections.kubernetes import KubernetesSpec
    covered = {c[2].split(".")[1].split("[")[0] for c in CASES}
    assert {f.name for f in dataclasses.fields(KubernetesSpec)} | set(KubernetesSpec.MOVED_KEYS) <= covered


@pytest.mark.parametrize("flavor", FLAVORS)
def test_free_text_cannot_change_structure(flavor: str) -> None:
    """Annotation values, the job path and the job file's text (in the launcher's ConfigMap),
    the only free text rendered, read back as the same two objects: no value adds a document,
    a key or a kind."""
    from clusterddp.schedulers.kubernetes.render import render_kubernetes, render_objects
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        section = {"annotations": {"a": INJECTION, "b": "---\napiVersion: v1\nkind: Secret"}}
        text = (SCRIPT + "name: job\ncontainer: {image: img}\nkubernetes: " + json.dumps(section) +
                "\n# ---\n# apiVersion: v1\n#   kind: Secret  \n")
        path.write_text(text, encoding="utf-8")
        job = load_job(path)
        docs = list(yaml.safe_load_all(render_kubernetes(job, "jobs/a: b #c.yaml", flavor)))
        assert docs == render_objects(job, "jobs/a: b #c.yaml", flavor)
    assert [d["kind"] for d in docs[:1]] == ["ConfigMap"] and len(docs) == 2
    assert docs[0]["data"] == {"job.yaml": text}
    assert docs[1]["metadata"]["annotations"] == section["annotations"]


def test_job_path_with_a_newline_refused() -> None:
    """A job path that is not one line is refused (it is written into the header comment)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(SCRIPT + "name: job\ncontainer: {image: img}\n", encoding="utf-8")
        job = load_job(path)
    with pytest.raises(JobSpecError, match="job file path: contains the control character"):
        render_manifest(job, "jobs/a\nkind: Pod.yaml", "jobset")


#: Strings that YAML readers type differently when written plain: numbers in YAML 1.2 (and to
#: kubectl) but strings to PyYAML (``0o17``, ``1e3``, a commit hash ``12345e6``), booleans to
#: kubectl's go-yaml but strings to PyYAML (``y``, ``n``), and words every reader types. As
#: label, nodeSelector and annotation values, and as annotation keys where a key may be one.
READER_TYPED = ["0o17", "1e3", "12345e6", "0x1F", "1_000", "012", "2001-12-14", "y", "N", "yes", "Off", "null",
                "true", "FALSE"]
ANNOTATION_ONLY = ["~", ".inf", "-.Inf", ".NaN", "1:20", "+1", "-1", "=", "<<", ""]
#: YAML 1.2 core schema (spec 10.3.2) and go-yaml v2's resolve table: a plain scalar matching
#: one of these is not a string to some reader.
NOT_A_STRING = re.compile(r"null|Null|NULL|~|true|True|TRUE|false|False|FALSE|y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON"
                          r"|off|Off|OFF|[-+]?[0-9][0-9_]*|0o[0-7]+|0x[0-9a-fA-F]+|0b[01_]+"
                          r"|[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)"
                          r"|\.(nan|NaN|NAN)|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?|\d{4}-\d\d?-\d\d?.*|<<|=|")


def _reader_typed_job(tmp: Path) -> Path:
    labels = {f"l{i}": value for i, value in enumerate(READER_TYPED)}
    notes = {**{f"a{i}": v for i, v in enumerate(READER_TYPED + ANNOTATION_ONLY)}, "y": "key", "null": "key"}
    section = {"labels": labels, "annotations": notes, "node_selector": {"n": "1e3", "m": "y"}}
    path = tmp / "job.yaml"
    path.write_text(SCRIPT + "name: job\ncontainer: {image: img}\nkubernetes: " + json.dumps(section) + "\n",
                    encoding="utf-8")
    return path


def _plain_scalars(node: yaml.Node) -> list[str]:
    if isinstance(node, yaml.ScalarNode):
        return [node.value] if node.style is None and node.tag == "tag:yaml.org,2002:str" else []
    children = node.value if isinstance(node, yaml.SequenceNode) else [v for kv in node.value for v in kv]
    return [value for child in children for value in _plain_scalars(child)]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_strings_stay_strings_for_every_yaml_reader(flavor: str) -> None:
    """Label, nodeSelector and annotation values (and keys) that YAML 1.1, YAML 1.2 and go-yaml type
    differently read back as the same strings: no string of the manifest is written plain where
    any of those readers would take it for a number, a boolean or a null."""
    from clusterddp.schedulers.kubernetes.render import render_kubernetes
    with tempfile.TemporaryDirectory() as tmp:
        job = load_job(_reader_typed_job(Path(tmp)))
        text = render_kubernetes(job, "jobs/job.yaml", flavor)
    plain = [value for doc in yaml.compose_all(text) for value in _plain_scalars(doc)]
    assert plain and [value for value in plain if NOT_A_STRING.fullmatch(value)] == []
    obj = list(yaml.safe_load_all(text))[-1]
    assert obj["metadata"]["labels"] == dict(job.kubernetes.labels)
    assert obj["metadata"]["annotations"] == dict(job.kubernetes.annotations)
    assert f'"{READER_TYPED[0]}"' in text and '"y": key' in text


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize("flavor", FLAVORS)
def test_kubectl_reads_the_same_strings(flavor: str, tmp_path: Path) -> None:
    """The real kubectl client, offline (``label --local``: its own YAML reader, no server), reads
    every rendered document, the reader-typed labels and annotations as the same strings."""
    from clusterddp.schedulers.kubernetes.render import render_documents
    job = load_job(_reader_typed_job(tmp_path))
    _, documents = render_documents(job, "jobs/job.yaml", flavor)
    for _, document in documents:
        done = subprocess.run(["kubectl", "label", "--local", "-f", "-", "cddp-check=1", "-o", "json"],
                              input=document, capture_output=True, text=True, timeout=60,
                              env={"PATH": os.environ["PATH"], "KUBECONFIG": os.devnull, "HOME": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        meta = json.loads(done.stdout)["metadata"]
        if meta["name"] == "job":
            assert meta["annotations"] == dict(job.kubernetes.annotations)
            assert meta["labels"] == {**job.kubernetes.labels, "cddp-check": "1"}


@pytest.mark.parametrize("lines,flavor,line,message", [
    (["backend: nccl"], "jobset", 2, "kubernetes.gpus: is 0 but the backend is nccl"),
    (["nproc_per_node: gpu"], "trainjob", 2, "kubernetes.gpus: is 0 but the nproc_per_node is 'gpu'"),
    (["backend: nccl", "kubernetes:", "  gpus: 0"], "jobset", 4, "kubernetes.gpus: is 0 but the backend is nccl"),
    (["nproc_per_node: 4", "backend: nccl", "kubernetes:", "  gpus: 2"], "pytorchjob", 5,
     "kubernetes.gpus: 2 GPUs per node for nproc_per_node 4: one GPU per worker"),
    (["restarts: 3000000000"], "jobset", 2, "restarts: must be an integer in 0..2147483647, got 3000000000"),
])
def test_render_time_refusals_name_the_line(lines: list[str], flavor: str, line: int, message: str) -> None:
    """The checks only a render makes (GPUs against the backend and the workers, JobSet's restart
    range) name file:line: the key's own line, else the line of the key it contradicts."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(SCRIPT + "\n".join(lines) + "\ncontainer: {image: img}\n", encoding="utf-8")
        job = load_job(path)
        with pytest.raises(JobSpecError) as info:
            render_manifest(job, "jobs/job.yaml", flavor)
    assert str(info.value).startswith(f"{path}:{line}: {message}"), str(info.value)
