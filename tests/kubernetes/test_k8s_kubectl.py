"""The kubectl boundary through the real CLI (``python -m clusterddp ACTION k8s``): argv built,
kubectl's documented JSON and error lines parsed, with a stand-in ``kubectl`` on PATH
(tests/kubernetes/fake_kubectl.py) that records each call."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterddp.schedulers.kubernetes import scheduler as k8s
from tests.conftest import REPO, cli, cli_env

FAKE = Path(__file__).resolve().parent / "fake_kubectl.py"
JOB = "jobs/cifar10.yaml"


@pytest.fixture
def kubectl_env(tmp_path: Path) -> dict[str, str]:
    """The CLI's environment with a ``kubectl`` on PATH that records its calls to FAKE_KUBECTL_LOG."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(f"#!{sys.executable}\n" + FAKE.read_text(encoding="utf-8"), encoding="utf-8")
    script.chmod(0o755)
    return cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_KUBECTL_LOG=str(tmp_path / "calls.jsonl"),
                   PYTHONPATH=str(REPO))


def calls(env: dict[str, str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in Path(env["FAKE_KUBECTL_LOG"]).read_text(encoding="utf-8").splitlines()]


def k8s_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, env=env)


def test_submit_pipes_the_manifest_to_kubectl_create(kubectl_env: dict[str, str]) -> None:
    """submit k8s runs 'kubectl --context C --namespace N create -f - -o name' for the launcher's
    ConfigMap, then for the TrainJob; the two stdins are the rendered manifest, in order."""
    done = k8s_cli(kubectl_env, "submit", "k8s", JOB, "--context", "lab", "--namespace", "team-a")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trainjob.trainer.kubeflow.org/cifar10\n"
    first, second = calls(kubectl_env)
    for call in (first, second):
        assert call["argv"] == ["--context", "lab", "--namespace", "team-a", "create", "-f", "-", "-o", "name"]
    assert [yaml.safe_load(str(c["stdin"]))["kind"] for c in (first, second)] == ["ConfigMap", "TrainJob"]
    rendered = cli("render", "k8s", JOB, "--namespace", "team-a", env=kubectl_env).stdout
    assert rendered.endswith(str(first["stdin"]) + str(second["stdin"]))
    assert "clusterddp logs k8s trainjob.trainer.kubeflow.org/cifar10" in done.stderr


def namespaced_job(tmp_path: Path, namespace: str = "team-vision") -> str:
    """jobs/cifar10.yaml with ``kubernetes.namespace`` set, beside a copy of its script."""
    data = yaml.safe_load((REPO / JOB).read_text(encoding="utf-8"))
    data["kubernetes"]["namespace"] = namespace
    path = tmp_path / "cifar10.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    (tmp_path / "cifar10.py").write_text("", encoding="utf-8")
    return str(path)


def test_namespace_flag_wins_over_the_job_file(kubectl_env: dict[str, str], tmp_path: Path) -> None:
    """kubernetes.namespace: team-vision, --namespace cddp-e2e: every object kubectl gets, and what
    render k8s --namespace prints, is in cddp-e2e (kubectl refuses an object of another namespace)."""
    job = namespaced_job(tmp_path)
    done = k8s_cli(kubectl_env, "submit", "k8s", job, "--namespace", "cddp-e2e")
    assert done.returncode == 0, done.stderr
    for call in calls(kubectl_env):
        assert call["argv"][:2] == ["--namespace", "cddp-e2e"]
        assert yaml.safe_load(str(call["stdin"]))["metadata"]["namespace"] == "cddp-e2e"
    rendered = k8s_cli(kubectl_env, "render", "k8s", job, "--namespace", "cddp-e2e", "--flavor", "jobset")
    assert rendered.returncode == 0, rendered.stderr
    assert [d["metadata"]["namespace"] for d in yaml.safe_load_all(rendered.stdout)] == ["cddp-e2e", "cddp-e2e"]
    bad = k8s_cli(kubectl_env, "render", "k8s", job, "--namespace", "Team_Vision")
    assert bad.returncode == 2 and "--namespace: invalid namespace value: 'Team_Vision'" in bad.stderr


@pytest.mark.parametrize("flags,namespace", [
    (("--context", "lab one", "--namespace", "team-a"), "team-a"),
    ((), "team-vision"),
])
def test_follow_up_hint_is_pasteable(kubectl_env: dict[str, str], tmp_path: Path, flags: tuple[str, ...],
                                     namespace: str) -> None:
    """The printed 'follow it with:' command keeps --context and the namespace used (the job
    file's included), shell-quoted; run as printed, it asks kubectl in the same place."""
    done = k8s_cli(kubectl_env, "submit", "k8s", namespaced_job(tmp_path), *flags)
    assert done.returncode == 0, done.stderr
    hint = done.stderr.strip().partition("follow it with: ")[2]
    assert hint == shlex.join(["clusterddp", "logs", "k8s", "trainjob.trainer.kubeflow.org/cifar10", *flags[:2],
                               "--namespace", namespace])
    Path(kubectl_env["FAKE_KUBECTL_LOG"]).unlink()
    again = k8s_cli(kubectl_env, *shlex.split(hint)[1:])
    assert again.returncode == 0, again.stderr
    where = [*flags[:2], "--namespace", namespace]
    assert all(c["argv"][:len(where)] == where for c in calls(kubectl_env))


def test_refused_object_deletes_its_configmap(kubectl_env: dict[str, str]) -> None:
    """The ConfigMap is created, the TrainJob refused (CRD missing): submit deletes the ConfigMap
    again and says why in one line, exit 2; nothing is left half-created."""
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": "nocrd-object"}, "submit", "k8s", JOB)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the cluster does not know TrainJob: its CRD is not installed" in done.stderr and done.stdout == ""
    assert [c["argv"] for c in calls(kubectl_env)] == [
        ["create", "-f", "-", "-o", "name"], ["create", "-f", "-", "-o", "name"],
        ["delete", "configmap/cifar10-clusterddp", "--ignore-not-found", "--wait=false"]]


def test_submit_dry_run_runs_no_kubectl(kubectl_env: dict[str, str]) -> None:
    """submit k8s --dry-run prints the JobSet and the kubectl command line, and runs nothing."""
    done = k8s_cli(kubectl_env, "submit", "k8s", JOB, "--flavor", "jobset", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "kind: JobSet" in done.stdout
    assert done.stdout.rstrip().endswith("# dry run: would run: kubectl create -f - -o name < MANIFEST")
    assert not Path(kubectl_env["FAKE_KUBECTL_LOG"]).exists()


def test_status_reads_phase_and_each_pod(kubectl_env: dict[str, str]) -> None:
    """status k8s KIND/NAME (as submit printed it): the object's latest true condition, each pod by node rank."""
    done = k8s_cli(kubectl_env, "status", "k8s", "jobset.jobset.x-k8s.io/cifar10", "--namespace", "team-a")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["TrainJob/cifar10: Created (JobSetCreated)",
                                        "  node 0: cifar10-node-0-0-x Running (running)",
                                        "  node 1: cifar10-node-0-1-x Running (running)"]
    base = ["--namespace", "team-a"]
    assert [c["argv"] for c in calls(kubectl_env)] == [
        [*base, "get", "jobsets.jobset.x-k8s.io", "cifar10", "-o", "json"],
        [*base, "get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=cifar10", "-o", "json"]]


def test_stop_deletes_the_object(kubectl_env: dict[str, str]) -> None:
    """stop k8s NAME --flavor pytorchjob: 'kubectl delete <resource> <name>' (the controller deletes
    what it owns), then the launcher's ConfigMap, absent or not."""
    done = k8s_cli(kubectl_env, "stop", "k8s", "cifar10", "--flavor", "pytorchjob")
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == 'configmap "cifar10-clusterddp" deleted', done
    assert [c["argv"] for c in calls(kubectl_env)] == [
        ["delete", "pytorchjobs.kubeflow.org", "cifar10", "--wait=false"],
        ["delete", "configmap/cifar10-clusterddp", "--ignore-not-found", "--wait=false"]]


def test_logs_prefix_each_line_with_the_node_rank(kubectl_env: dict[str, str]) -> None:
    """logs k8s NAME: one 'kubectl logs -f POD' per pod, every line prefixed [node R]."""
    done = k8s_cli(kubectl_env, "logs", "k8s", "cifar10")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[node 0] hello from cifar10-node-0-0-x",
                                                "[node 1] hello from cifar10-node-0-1-x"]


@pytest.mark.parametrize("args,fragment", [
    (("jobset/-x",), "object name must be a DNS-1123 label"),
    (("cronjob/x",), "unknown kind 'cronjob'"),
    (("jobset/x", "--flavor", "trainjob"), "is a jobset, but --flavor says trainjob"),
])
def test_status_refuses_a_bad_object_name(kubectl_env: dict[str, str], args: tuple[str, ...], fragment: str) -> None:
    """A name kubectl would read as a flag, an unknown kind, or a kind that contradicts --flavor: one line, exit 2."""
    done = k8s_cli(kubectl_env, "status", "k8s", *args)
    assert done.returncode == 2 and fragment in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not Path(kubectl_env["FAKE_KUBECTL_LOG"]).exists()


@pytest.mark.parametrize("scenario,fragment", [
    ("unreachable", "cannot reach the API server at localhost:8080: connection refused"),
    ("forbidden", 'forbidden: User "alice" cannot create resource "trainjobs"'),
    ("exists", "trainjob cifar10 already exists in the context's namespace"),
    ("nocrd", "the cluster does not know TrainJob: its CRD is not installed"),
    ("nonamespace", "namespace nope does not exist"),
])
def test_server_refusals_are_one_line_exit_2(kubectl_env: dict[str, str], scenario: str, fragment: str) -> None:
    """Each documented kubectl failure of submit k8s is one line on stderr with exit code 2."""
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": scenario}, "submit", "k8s", JOB)
    assert done.returncode == 2 and fragment in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


NO_CRD = "its CRD is not installed (see docs/kubernetes.md, 'Installing the CRDs')"
UNAUTHORIZED = ("kubectl: unauthorized: the API server refused the kubeconfig's credentials (an expired or wrong "
                "token or certificate)")
UNTRUSTED = ("kubectl: the API server's certificate is not trusted (certificate signed by unknown authority): check "
             "the cluster's certificate-authority in the kubeconfig")


@pytest.mark.parametrize("action,scenario,line", [
    ("submit", "openapi-refused", "kubectl: cannot reach the API server at https://127.0.0.1:6449: connect: "
                                  "connection refused"),
    ("submit", "openapi-x509", UNTRUSTED),
    ("submit", "openapi-unauthorized", UNAUTHORIZED),
    ("submit", "stale-cache", f"kubectl: the cluster does not know JobSet: {NO_CRD}"),
    ("status", "refused", "kubectl: cannot reach the API server at 127.0.0.1:6449: connection refused"),
    ("status", "x509", UNTRUSTED),
    ("status", "unauthorized", UNAUTHORIZED),
])
def test_kubectl_raw_words_become_the_cause(kubectl_env: dict[str, str], action: str, scenario: str,
                                             line: str) -> None:
    """kubectl v1.32.4's words for a dead port, a wrong CA, a bad token (its openapi download on
    submit, klog lines on status) and a CRD its discovery cache still lists: one line naming the
    cause, exit 2; a refused object's ConfigMap is deleted again."""
    args = ("submit", "k8s", JOB) if action == "submit" else ("status", "k8s", "cifar10")
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": scenario}, *args)
    assert (done.returncode, done.stderr, done.stdout) == (2, f"clusterddp: error: {line}\n", "")
    if scenario == "stale-cache":
        assert calls(kubectl_env)[-1]["argv"][1] == "configmap/cifar10-clusterddp"


@pytest.mark.parametrize("action,scenario,line", [
    ("logs", "nonamespace", "kubectl: namespace nope does not exist"),
    ("logs", "nocrd-get", f"kubectl: the cluster does not know TrainJob: {NO_CRD}"),
    ("logs", "gone", "kubectl: trainjob cifar10 not found in namespace nope"),
    ("stop", "nonamespace", "kubectl: namespace nope does not exist"),
    ("stop", "gone", "kubectl: trainjob cifar10 not found in namespace nope"),
    ("status", "gone", "kubectl: trainjob cifar10 not found in namespace nope"),
])
def test_logs_and_stop_name_what_is_missing(kubectl_env: dict[str, str], action: str, scenario: str,
                                            line: str) -> None:
    """logs in a missing namespace or without the CRD (kubectl lists no pods there, rc 0) and stop
    in a missing namespace (kubectl delete says only 'not found') name what is missing."""
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": scenario}, action, "k8s", "cifar10", "--namespace", "nope")
    assert (done.returncode, done.stderr, done.stdout) == (2, f"clusterddp: error: {line}\n", "")


@pytest.mark.parametrize("make", ["directory", "not-executable"])
def test_kubectl_that_cannot_run_is_one_line(tmp_path: Path, make: str) -> None:
    """A kubectl on PATH that is a directory or a file without execute permission: one line naming it, exit 2."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    if make == "directory":
        kubectl.mkdir()
    else:
        kubectl.write_text("#!/bin/sh\n", encoding="utf-8")
        kubectl.chmod(0o644)
    env = cli_env(PATH=str(bin_dir), PYTHONPATH=str(REPO))  # exec skips it for a kubectl further on PATH
    for args in (("submit", "k8s", JOB), ("status", "k8s", "cifar10"), ("logs", "k8s", "cifar10")):
        done = cli(*args, env=env)
        what = "is a directory" if make == "directory" else "cannot be run (Permission denied)"
        assert (done.returncode, done.stderr) == (
            2, f"clusterddp: error: '{kubectl}' {what} (hint: put an executable kubectl first on PATH)\n"), args


@pytest.mark.parametrize("scenario,line", [
    ("not-utf8", "kubectl printed output that is not UTF-8 (byte 46)"),
    ("deep", "kubectl printed JSON nested too deeply to read"),
    ("status-string", "kubectl printed the object's status as str, not an object"),
    ("pod-status-string", "kubectl printed a pod's status as str, not an object"),
])
def test_untrusted_kubectl_output_is_one_line(kubectl_env: dict[str, str], scenario: str, line: str) -> None:
    """kubectl's output is untrusted input: not UTF-8, 200,000-deep JSON, a status or a pod status
    that is a string: status k8s says so in one line, exit 2, no traceback."""
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": scenario}, "status", "k8s", "cifar10")
    assert (done.returncode, done.stderr, done.stdout) == (2, f"clusterddp: error: {line}\n", "")


def test_logs_keep_a_line_that_is_not_utf8(kubectl_env: dict[str, str]) -> None:
    """A Latin-1 byte in one pod's log is shown escaped, and that pod's later lines still come."""
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": "log-latin1"}, "logs", "k8s", "cifar10")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert sorted(done.stdout.splitlines()) == ["[node 0] epoch 1 caf\\xe9 loss 2.1", "[node 0] hello from cifar10-node-0-0-x",
                                                "[node 1] epoch 1 caf\\xe9 loss 2.1", "[node 1] hello from cifar10-node-0-1-x"]


def test_submit_masks_a_passthrough_value_kubectl_echoes(kubectl_env: dict[str, str], tmp_path: Path) -> None:
    """An env_passthrough value set here and echoed in kubectl's refusal is printed as ***, as
    submit slurm prints it; the refused object's ConfigMap is deleted again."""
    secret = "wandb-0123456789abcdef"
    data = yaml.safe_load((REPO / JOB).read_text(encoding="utf-8"))
    data.update(env_passthrough=["WANDB_API_KEY"], kubernetes={**data["kubernetes"], "secret": "wandb"})
    job = tmp_path / "cifar10.yaml"
    job.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    (tmp_path / "cifar10.py").write_text("", encoding="utf-8")
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": "echo-secret", "WANDB_API_KEY": secret},
                   "submit", "k8s", str(job))
    assert done.returncode == 2 and secret not in done.stderr + done.stdout, done.stderr
    assert done.stderr == ('clusterddp: error: kubectl: the server refused the object: is invalid: '
                           'metadata.annotations: Invalid value: "***": must be no more than 63 characters\n')
    assert secret not in "".join(str(c["stdin"]) for c in calls(kubectl_env))


def test_status_of_a_kind_the_server_lacks(kubectl_env: dict[str, str]) -> None:
    """status k8s against a server without the CRD: one line naming the missing resource type, exit 2."""
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": "nocrd-get"}, "status", "k8s", "cifar10")
    assert done.returncode == 2 and "the cluster does not know TrainJob: its CRD is not installed" in done.stderr


@pytest.mark.parametrize("action,scenario", [
    ("submit", "stale-cache"), ("status", "nocrd-get"), ("logs", "nocrd-get"), ("stop", "nocrd-get")])
def test_a_missing_crd_reads_the_same_from_every_action(kubectl_env: dict[str, str], action: str,
                                                        scenario: str) -> None:
    """Without the JobSet CRD, submit (kubectl: 'the server could not find the requested resource
    (post jobsets.jobset.x-k8s.io)') and status, logs, stop (kubectl: 'the server doesn't have a
    resource type "jobsets"') print the same line, naming the kind as the docs do."""
    args = (JOB,) if action == "submit" else ("cifar10",)
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": scenario}, action, "k8s", *args, "--flavor", "jobset")
    assert (done.returncode, done.stderr, done.stdout) == (
        2, f"clusterddp: error: kubectl: the cluster does not know JobSet: {NO_CRD}\n", ""), action


@pytest.mark.parametrize("scenario,line", [
    ("exists", "trainjob cifar10 already exists in namespace team-a: stop it first (clusterddp stop k8s "
               "trainjob.trainer.kubeflow.org/cifar10 --namespace team-a), or set kubernetes.name"),
    ("exists-jobset", "jobset cifar10 already exists in namespace team-a: stop it first (clusterddp stop k8s "
                      "jobset.jobset.x-k8s.io/cifar10 --namespace team-a), or set kubernetes.name"),
    ("exists-configmap-only", "the launcher ConfigMap cifar10-clusterddp of an earlier job cifar10 is left in "
                              "namespace team-a, with no trainjob, jobset or pytorchjob cifar10 there: delete it "
                              "(kubectl delete configmap/cifar10-clusterddp), or set kubernetes.name"),
    ("exists-object", "trainjob cifar10 already exists in namespace team-a: stop it first (clusterddp stop k8s "
                      "trainjob.trainer.kubeflow.org/cifar10 --namespace team-a), or set kubernetes.name"),
])
def test_a_second_submit_names_the_job_not_its_configmap(kubectl_env: dict[str, str], scenario: str,
                                                          line: str) -> None:
    """Submitting the same job twice: kubectl refuses the launcher's ConfigMap first ('configmaps
    "cifar10-clusterddp" already exists'); the line names the job that holds the name (a trainjob,
    or a jobset of the same name), or the ConfigMap left over without one, with the way out. The
    other job's ConfigMap is never deleted; one this submit created is."""
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": scenario}, "submit", "k8s", JOB, "--namespace", "team-a")
    assert (done.returncode, done.stderr, done.stdout) == (2, f"clusterddp: error: kubectl: {line}\n", "")
    deleted = [c["argv"] for c in calls(kubectl_env) if "delete" in c["argv"]]  # type: ignore[operator]
    if scenario == "exists-object":
        assert deleted == [["--namespace", "team-a", "delete", "configmap/cifar10-clusterddp", "--ignore-not-found",
                            "--wait=false"]]
    else:
        assert deleted == []


def test_logs_follow_the_pods_a_restart_creates(kubectl_env: dict[str, str]) -> None:
    """A JobSet restart ends attempt 0's pods and creates attempt 1's under new names: logs k8s
    follows those too, and returns once the object is complete and every stream ended."""
    done = k8s_cli({**kubectl_env, "FAKE_KUBECTL_SCENARIO": "restart"}, "logs", "k8s", "cifar10")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[node 0] hello from cifar10-node-0-0-x",
                                                "[node 0] hello from cifar10-node-0-0-y",
                                                "[node 1] hello from cifar10-node-0-1-x",
                                                "[node 1] hello from cifar10-node-0-1-y"], done.stdout
    assert "clusterddp: following pod cifar10-node-0-0-y (node 0), new since the start\n" in done.stderr


def test_kubectl_whose_interpreter_is_missing_is_named(tmp_path: Path) -> None:
    """A kubectl on PATH whose #! interpreter does not exist (exec says ENOENT, as for no file at
    all): submit, status and logs say the file exists but cannot be executed, naming the
    interpreter, exit 2; not 'not found on PATH'."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text("#!/nonexistent/python3 -u\nprint('hi')\n", encoding="utf-8")
    kubectl.chmod(0o755)
    env = cli_env(PATH=str(bin_dir), PYTHONPATH=str(REPO))
    for args in (("submit", "k8s", JOB), ("status", "k8s", "cifar10"), ("logs", "k8s", "cifar10")):
        done = cli(*args, env=env)
        assert (done.returncode, done.stderr) == (
            2, f"clusterddp: error: '{kubectl}' exists but cannot be executed: its interpreter '/nonexistent/python3' "
               "(its #! line) does not exist (hint: fix its #! line, or put a kubectl that runs first on PATH)\n"), args


def test_no_kubectl_on_path(tmp_path: Path) -> None:
    """No kubectl on PATH: submit k8s says so in one line, exit 2."""
    done = cli("submit", "k8s", JOB, env=cli_env(PATH=str(tmp_path), PYTHONPATH=str(REPO)))
    assert done.returncode == 2 and "'kubectl' not found on PATH" in done.stderr, done.stderr


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


def test_render_writes_the_manifest(tmp_path: Path) -> None:
    """render k8s --flavor jobset -o PATH writes the JobSet of jobs/cifar10.yaml and says how to create it."""
    out = tmp_path / "cifar10.jobset.yaml"
    done = cli("render", "k8s", JOB, "--flavor", "jobset", "-o", str(out), env=cli_env(PYTHONPATH=str(REPO)))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert [d["kind"] for d in yaml.safe_load_all(out.read_text(encoding="utf-8"))] == ["ConfigMap", "JobSet"]
    assert f"kubectl create -f {out}" in done.stderr


def test_job_dir_resolves_the_scripts_path_as_in_the_checkout(tmp_path: Path) -> None:
    """The pod's command: 'run /etc/clusterddp/cifar10.yaml --job-dir jobs' finds script cifar10.py at
    jobs/cifar10.py of the working directory; without --job-dir, beside the job file (not there)."""
    copy = tmp_path / "cifar10.yaml"
    copy.write_text((REPO / JOB).read_text(encoding="utf-8"), encoding="utf-8")
    env = cli_env(PYTHONPATH=str(REPO))
    found = subprocess.run([sys.executable, "-m", "clusterddp", "run", "--dry-run", str(copy), "--job-dir", "jobs"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0 and str(REPO / "jobs" / "cifar10.py") in found.stdout, found.stderr
    missing = subprocess.run([sys.executable, "-m", "clusterddp", "run", "--dry-run", str(copy)],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and f"{copy}:10: script: no such file" in missing.stderr, missing.stderr
