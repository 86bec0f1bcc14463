"""``submit`` on a platform records the job (issue 33, goal 5): ``<scheduler>-<id>``, pending,
with the options its ``status``/``stop``/``logs`` need again, never the token. The platforms
are this suite's stand-ins (OpenPAI's REST server, kubectl), as their own tests use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "openpai"))  # its tests import their server as pai_server

from tests.kubernetes.test_k8s_kubectl import kubectl_env  # noqa: F401  (a fixture)
from tests.openpai.test_openpai_rest import JOB as PAI_JOB, TOKEN, env as pai_env, no_proxy, pai  # noqa: F401
from pai_server import FakeOpenPAI  # noqa: E402
from tests.registry.helpers import records


def test_a_kubernetes_submit_is_recorded(kubectl_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, "-m", "clusterddp", "submit", "k8s", "jobs/cifar10.yaml", "--context", "lab",
                           "--namespace", "team-a"], cwd=REPO, env={**kubectl_env, "CLUSTERDDP_HOME": str(home)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [record] = records(home)
    assert record["run_id"] == "k8s-trainjob.trainer.kubeflow.org_cifar10"
    assert (record["target"], record["state"], record["job_id"]) == ("k8s", "pending",
                                                                      "trainjob.trainer.kubeflow.org/cifar10")
    assert record["where"] == "namespace team-a context lab" and record["launcher"] is None
    assert record["scheduler_options"] == {"context": "lab", "namespace": "team-a", "id_field": "name"}


def test_an_openpai_submit_is_recorded_without_its_token(pai: FakeOpenPAI, tmp_path: Path) -> None:  # noqa: F811
    home = tmp_path / "home"
    run_env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()}, **pai_env(),
               "CLUSTERDDP_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "clusterddp", "submit", "openpai", PAI_JOB, "--url", pai.url],
                          capture_output=True, text=True, env=run_env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    [record] = records(home)
    assert (record["run_id"], record["job_id"], record["target"]) == ("openpai-alice_minimal", "alice~minimal",
                                                                      "openpai")
    assert record["scheduler_options"]["url"] == pai.url
    assert TOKEN not in json.dumps(record)
