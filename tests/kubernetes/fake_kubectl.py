"""A stand-in for kubectl talking to an API server (none can be installed here): it records
its argv and stdin, and answers with kubectl's documented output for the scenario named in
FAKE_KUBECTL_SCENARIO. Installed as ``kubectl`` on PATH by the tests."""

import json
import os
import re
import sys

SCENARIO = os.environ.get("FAKE_KUBECTL_SCENARIO", "ok")
STDERR = {
    "unreachable": "The connection to the server localhost:8080 was refused - did you specify the right host or port?",
    "forbidden": 'Error from server (Forbidden): error when creating "STDIN": trainjobs.trainer.kubeflow.org is '
                 'forbidden: User "alice" cannot create resource "trainjobs" in API group "trainer.kubeflow.org" '
                 'in the namespace "prod"',
    "exists": 'Error from server (AlreadyExists): error when creating "STDIN": trainjobs.trainer.kubeflow.org '
              '"cifar10" already exists',
    "nocrd": 'error: resource mapping not found for name: "cifar10" namespace: "" from "STDIN": no matches for '
             'kind "TrainJob" in version "trainer.kubeflow.org/v1alpha1"\nensure CRDs are installed first',
    "nocrd-get": 'error: the server doesn\'t have a resource type "trainjobs"',
    "nonamespace": 'Error from server (NotFound): error when creating "STDIN": namespaces "nope" not found',
}
#: Scenarios that refuse only the create of the job object: its ConfigMap is created first.
OBJECT_ONLY = {"nocrd-object": "nocrd"}
POD = {"metadata": {"name": "cifar10-node-0-{i}-x", "annotations": {"batch.kubernetes.io/job-completion-index": "{i}"}},
       "status": {"phase": "Running", "containerStatuses": [{"name": "node", "state": {"running": {}}}]}}


def main() -> int:
    argv = sys.argv[1:]
    stdin = sys.stdin.read() if "-" in argv else ""
    with open(os.environ["FAKE_KUBECTL_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"argv": argv, "stdin": stdin}) + "\n")
    kind = re.search(r"^kind: (\w+)$", stdin, re.MULTILINE)
    configmap = kind is not None and kind.group(1) == "ConfigMap"
    given = argv[argv.index("--namespace") + 1] if "--namespace" in argv else None
    written = re.search(r"^  namespace: \"?([^\"\n]+)\"?$", stdin, re.MULTILINE)
    if "create" in argv and given and written and written.group(1) != given:
        # kubectl v1.32.4, shared/testbeds/kubernetes/README.md (job file namespace vs --namespace)
        sys.stderr.write(f'error: the namespace from the provided object "{written.group(1)}" does not match the '
                         f'namespace "{given}". You must pass \'--namespace={written.group(1)}\' to perform this '
                         'operation.\n')
        return 1
    if SCENARIO in STDERR or (SCENARIO in OBJECT_ONLY and "create" in argv and not configmap):
        sys.stderr.write(STDERR[OBJECT_ONLY.get(SCENARIO, SCENARIO)] + "\n")
        return 1
    if "create" in argv and configmap:
        name = re.search(r"^  name: (\S+)$", stdin, re.MULTILINE)
        print(f"configmap/{name.group(1) if name else '?'}")
    elif "create" in argv:
        print("trainjob.trainer.kubeflow.org/cifar10")
    elif "get" in argv and "pods" in argv:
        items = [json.loads(json.dumps(POD).replace("{i}", str(i))) for i in (1, 0)]
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    elif "get" in argv:
        print(json.dumps({"kind": "TrainJob", "metadata": {"name": "cifar10"}, "status": {"conditions": [
            {"type": "Created", "status": "True", "reason": "JobSetCreated"},
            {"type": "Complete", "status": "False"}]}}))
    elif "delete" in argv:
        named = [a for a in argv[argv.index("delete") + 1:] if "/" in a]  # KIND/NAME, as kubectl prints them
        for kind, _, name in (a.partition("/") for a in named):
            print(f'{kind.split(".")[0]} "{name}" deleted')
        if not named:
            print('trainjob.trainer.kubeflow.org "cifar10" deleted')
    elif "logs" in argv:
        print(f"hello from {argv[-1]}")
    return 0


sys.exit(main())
