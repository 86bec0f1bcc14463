"""``clusterddp ls`` asks OpenPAI and Kubernetes what became of the runs submitted there (issue
33, goal 3): one platform call per target (an OpenPAI cluster and user: ``GET
/api/v2/jobs?username=U``; a kube context and namespace: ``kubectl get KINDS -o json``), not one
per run; a final state is written into the record, so it is not asked again; ``restarting``
where the platform says a job waits for its next attempt. The platforms are this suite's
stand-ins (tests/openpai/pai_server.py, tests/kubernetes/fake_kubectl.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "openpai"))  # its tests import their server as pai_server

from tests.kubernetes.test_k8s_kubectl import calls, kubectl_env  # noqa: F401  (a fixture)
from tests.openpai.test_openpai_rest import JOB as PAI_JOB, env as pai_env, no_proxy, pai  # noqa: F401
from pai_server import FakeOpenPAI  # noqa: E402


def _cli(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=REPO, capture_output=True, text=True,
                          env={**env, "CLUSTERDDP_HOME": str(home)}, timeout=300)


def _rows(home: Path, env: dict[str, str], *flags: str) -> dict[str, dict[str, Any]]:
    done = _cli(home, env, "ls", "--json", *flags)
    assert done.returncode == 0, done.stderr
    return {row["run_id"]: row for row in json.loads(done.stdout)["runs"]}


def test_openpai_runs_are_refreshed_with_one_call_per_user(pai: FakeOpenPAI, tmp_path: Path) -> None:  # noqa: F811
    """Three submitted jobs: one succeeded, one failed with exit 3, one waits for its retry.
    ``ls`` asks the server once for all three and shows finished / failed (exit 3) / restarting
    (2 attempts); the next ``ls`` asks only about the one still going."""
    home = tmp_path / "home"
    env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()}, **pai_env()}
    for name in ("ok", "broken", "retrying"):
        done = _cli(home, env, "submit", "openpai", PAI_JOB, "--url", pai.url, "--name", name)
        assert done.returncode == 0, done.stderr
    pai.jobs["alice~ok"]["jobStatus"].update(state="SUCCEEDED", appExitCode=0)
    pai.jobs["alice~broken"]["jobStatus"].update(state="FAILED", appExitCode=3)
    pai.jobs["alice~retrying"]["jobStatus"].update(state="WAITING", retries=1)
    rows = _rows(home, env)
    assert pai.list_calls == 1, [r.path for r in pai.requests]
    assert [r.path for r in pai.requests if r.method == "GET"] == ["/rest-server/api/v2/jobs?username=alice"]
    got = {run_id: (row["state"], row["exit_code"], row["attempts"]) for run_id, row in rows.items()}
    assert got == {"openpai-alice_ok": ("finished", 0, 1), "openpai-alice_broken": ("failed", 3, 1),
                   "openpai-alice_retrying": ("restarting", None, 2)}, got
    again = _rows(home, env)
    assert pai.list_calls == 2 and again["openpai-alice_ok"]["state"] == "finished"  # kept: never asked again
    pai.jobs["alice~retrying"]["jobStatus"].update(state="RUNNING")
    assert _rows(home, env)["openpai-alice_retrying"]["state"] == "running"


def test_openpai_unreachable_is_a_note_and_ls_still_lists(pai: FakeOpenPAI, tmp_path: Path) -> None:  # noqa: F811
    """The server gone: the run stays as recorded with 'not checked: ...'; ls exits 0."""
    home = tmp_path / "home"
    env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()}, **pai_env()}
    assert _cli(home, env, "submit", "openpai", PAI_JOB, "--url", pai.url).returncode == 0
    record = home / "runs" / "openpai-alice_minimal.json"
    data = json.loads(record.read_text())
    data["scheduler_options"]["url"] = "http://127.0.0.1:9"  # the discard port: refused
    record.write_text(json.dumps(data))
    [row] = _rows(home, env).values()
    assert row["state"] == "pending" and row["note"].startswith("not checked: cannot reach OpenPAI"), row


def _k8s_object(kind: str, name: str, *conditions: str, restarts: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": c, "status": "True", "reason": f"{c}Reason"}
                                             for c in conditions]}
    if restarts is not None:
        status["restarts"] = restarts
    return {"apiVersion": "x/v1", "kind": kind, "metadata": {"name": name, "namespace": "team-a"}, "status": status}


def _k8s_record(home: Path, kind: str, name: str, namespace: str) -> None:
    from clusterddp.registry import store

    store.save(store.RunRecord(run_id=f"k8s-{kind}_{name}", target="k8s", job=name, run_dir="", hosts=[],
                               job_id=f"{kind}/{name}", state="pending", started=store.now(),
                               scheduler_options={"context": "lab", "namespace": namespace, "id_field": "name"}),
               {store.HOME_ENV: str(home)})


def test_kubernetes_runs_are_refreshed_with_one_kubectl_per_namespace(kubectl_env: dict[str, str],  # noqa: F811
                                                                      tmp_path: Path) -> None:
    """Four runs in two namespaces: a TrainJob complete, a TrainJob failed, a PyTorchJob
    restarting, a JobSet restarted twice and running. ``ls`` runs kubectl once per namespace
    (every kind of that namespace in one ``get``) and shows finished / failed / restarting /
    running (3 attempts); the final ones are kept and not asked again."""
    home = tmp_path / "home"
    trainjob, pytorchjob, jobset = ("trainjob.trainer.kubeflow.org", "pytorchjob.kubeflow.org",
                                    "jobset.jobset.x-k8s.io")
    for kind, name, namespace in ((trainjob, "done", "team-a"), (trainjob, "broken", "team-a"),
                                  (pytorchjob, "again", "team-a"), (jobset, "busy", "team-b")):
        _k8s_record(home, kind, name, namespace)
    listing = tmp_path / "objects.json"
    listing.write_text(json.dumps([
        _k8s_object("TrainJob", "done", "Created", "Complete"), _k8s_object("TrainJob", "broken", "Created", "Failed"),
        _k8s_object("PyTorchJob", "again", "Created", "Running", "Restarting"),
        _k8s_object("JobSet", "busy", "StartupPolicyCompleted", restarts=2)]))
    env = {**kubectl_env, "FAKE_KUBECTL_LIST": str(listing)}
    rows = _rows(home, env)
    got = {run_id.split("_", 1)[1]: (row["state"], row["attempts"]) for run_id, row in rows.items()}
    assert got == {"done": ("finished", 1), "broken": ("failed", 1), "again": ("restarting", 1),
                   "busy": ("running", 3)}, got
    argvs = sorted(call["argv"] for call in calls(env))  # type: ignore[type-var]
    assert argvs == [["--context", "lab", "--namespace", "team-a", "get",
                      "pytorchjobs.kubeflow.org,trainjobs.trainer.kubeflow.org", "-o", "json"],
                     ["--context", "lab", "--namespace", "team-b", "get", "jobsets.jobset.x-k8s.io", "-o", "json"]]
    _rows(home, env)
    again = sorted(call["argv"] for call in calls(env)[2:])  # type: ignore[type-var]
    assert again == [["--context", "lab", "--namespace", "team-a", "get", "pytorchjobs.kubeflow.org", "-o", "json"],
                     ["--context", "lab", "--namespace", "team-b", "get", "jobsets.jobset.x-k8s.io", "-o", "json"]]
