"""A stand-in for kubectl talking to an API server (none can be installed here): it records
its argv and stdin, and answers with kubectl's output for the scenario named in
FAKE_KUBECTL_SCENARIO: kubectl v1.32.4's own words as recorded against a real API server
(shared/testbeds/kubernetes/README.md), byte for byte. Installed as ``kubectl`` on PATH by the tests."""

import json
import os
import re
import sys

SCENARIO = os.environ.get("FAKE_KUBECTL_SCENARIO", "ok")
#: kubectl create's openapi download, which comes first, failing (submit against a dead port,
#: a wrong CA, a bad token).
OPENAPI = ('error: error validating "STDIN": error validating data: failed to download openapi: {0}; if you choose '
           'to ignore these errors, turn validation off with --validate=false')
KLOG = ('E1125 21:09:15.597355   19314 memcache.go:265] "Unhandled Error" err="couldn\'t get current server API '
        'group list: the server has asked for the client to provide credentials"')
STDERR = {
    "unreachable": "The connection to the server localhost:8080 was refused - did you specify the right host or port?",
    "refused": "The connection to the server 127.0.0.1:6449 was refused - did you specify the right host or port?",
    "x509": "Unable to connect to the server: tls: failed to verify certificate: x509: certificate signed by unknown "
            "authority",
    "unauthorized": "\n".join([KLOG] * 5 + ["error: You must be logged in to the server (the server has asked for "
                                            "the client to provide credentials)"]),
    "openapi-refused": OPENAPI.format('Get "https://127.0.0.1:6449/openapi/v2?timeout=32s": dial tcp 127.0.0.1:6449: '
                                      'connect: connection refused'),
    "openapi-x509": OPENAPI.format('Get "https://127.0.0.1:6443/openapi/v2?timeout=32s": tls: failed to verify '
                                   'certificate: x509: certificate signed by unknown authority'),
    "openapi-unauthorized": OPENAPI.format("the server has asked for the client to provide credentials"),
    "forbidden": 'Error from server (Forbidden): error when creating "STDIN": trainjobs.trainer.kubeflow.org is '
                 'forbidden: User "alice" cannot create resource "trainjobs" in API group "trainer.kubeflow.org" '
                 'in the namespace "prod"',
    # The object exists, its ConfigMap deleted by hand: the ConfigMap is created, the object refused.
    "exists-object": 'Error from server (AlreadyExists): error when creating "STDIN": trainjobs.trainer.kubeflow.org '
                     '"cifar10" already exists',
    "nocrd": 'error: resource mapping not found for name: "cifar10" namespace: "" from "STDIN": no matches for '
             'kind "TrainJob" in version "trainer.kubeflow.org/v1alpha1"\nensure CRDs are installed first',
    # The CRD removed while kubectl's discovery cache (~/.kube/cache) still lists it.
    "stale-cache": 'Error from server (NotFound): error when creating "STDIN": the server could not find the '
                   'requested resource (post jobsets.jobset.x-k8s.io)',
    "echo-secret": 'The TrainJob "cifar10" is invalid: metadata.annotations: Invalid value: "{secret}": must be no '
                   'more than 63 characters',
}
#: Scenarios that refuse only the create of the job object: its ConfigMap is created first.
OBJECT_ONLY = {"nocrd-object": "nocrd", "stale-cache": "stale-cache", "echo-secret": "echo-secret",
               "exists-object": "exists-object"}
#: A second submit of the same name: the launcher's ConfigMap, created first, is refused (kubectl
#: v1.32.4, shared/testbeds/kubernetes/README.md "submit twice"); which object holds the name:
#: the resource ``get`` finds (None: only the ConfigMap is left).
TAKEN = {"exists": "trainjobs.trainer.kubeflow.org", "exists-object": "trainjobs.trainer.kubeflow.org",
         "exists-jobset": "jobsets.jobset.x-k8s.io", "exists-configmap-only": None}
CONFIGMAP_EXISTS = ('Error from server (AlreadyExists): error when creating "STDIN": configmaps "{0}" already '
                    'exists')
#: ``kubectl create -o name`` / ``delete``: each kind as kubectl names it (singular.group).
NAMES = {"ConfigMap": "configmap", "TrainJob": "trainjob.trainer.kubeflow.org", "JobSet": "jobset.jobset.x-k8s.io",
         "PyTorchJob": "pytorchjob.kubeflow.org"}
#: Scenarios of a cluster that lacks something: (what ``get``/``delete`` of the object say, what
#: ``get pods`` says). kubectl lists no pods, rc 0, in a missing namespace or without the CRD.
MISSING = {
    "nonamespace": 'Error from server (NotFound): namespaces "nope" not found',
    "nocrd-get": 'error: the server doesn\'t have a resource type "{plural}"',
    "gone": 'Error from server (NotFound): {resource} "{name}" not found',
}
#: ``kubectl delete`` of an object in a missing namespace says only that the object is not found.
DELETE_MISSING = {"nonamespace": 'Error from server (NotFound): {resource} "{name}" not found'}
POD = {"metadata": {"name": "cifar10-node-0-{i}-{a}", "annotations": {"batch.kubernetes.io/job-completion-index": "{i}"},
                    "labels": {"jobset.sigs.k8s.io/restart-attempt": "{n}"}},
       "status": {"phase": "Running", "containerStatuses": [{"name": "node", "state": {"running": {}}}]}}
#: Pod name suffix of each JobSet restart attempt ("restart": attempt 0's pods end, attempt 1's come).
ATTEMPTS = ("x", "y")
EMPTY_LIST = {"apiVersion": "v1", "items": [], "kind": "List", "metadata": {"resourceVersion": ""}}


def singular(resource: str) -> str:
    """``trainjobs.trainer.kubeflow.org`` as kubectl prints an object of it: ``trainjob.trainer.kubeflow.org``."""
    plural, _, group = resource.partition(".")
    return f"{plural.removesuffix('s')}.{group}"


def json_out(value: object) -> None:
    """``-o json`` as kubectl prints it: Go's json.MarshalIndent, 4 spaces, keys sorted."""
    print(json.dumps(value, indent=4, sort_keys=True))


def served(log_path: str) -> set[str]:
    """The pods whose ``kubectl logs`` this fake has answered so far (from its own call log)."""
    with open(log_path, encoding="utf-8") as log:
        calls = [json.loads(line)["argv"] for line in log]
    return {argv[-1] for argv in calls if "logs" in argv}


def attempt_now(log_path: str) -> int:
    """The JobSet's restart attempt: "restart" goes to attempt 1 once attempt 0's logs were read
    (its pods ended); any other scenario stays at 0."""
    if SCENARIO != "restart":
        return 0
    return 1 if {f"cifar10-node-0-{i}-x" for i in (0, 1)} <= served(log_path) else 0


def pods_now(log_path: str) -> list[dict[str, object]]:
    attempt = attempt_now(log_path)
    return [json.loads(json.dumps(POD).replace("{i}", str(i)).replace("{a}", ATTEMPTS[attempt])
                       .replace("{n}", str(attempt))) for i in (1, 0)]


def out(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def fail(text: str) -> int:
    sys.stderr.write(text + "\n")
    return 1


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
        return fail(f'error: the namespace from the provided object "{written.group(1)}" does not match the '
                    f'namespace "{given}". You must pass \'--namespace={written.group(1)}\' to perform this operation.')
    name_in = re.search(r"^  name: \"?([^\"\n]+)\"?$", stdin, re.MULTILINE)
    if SCENARIO in TAKEN and "create" in argv and configmap and SCENARIO != "exists-object":
        return fail(CONFIGMAP_EXISTS.format(name_in.group(1) if name_in else "?"))
    if SCENARIO in TAKEN and "get" in argv and "-o" in argv and argv[argv.index("-o") + 1] == "name":
        after = argv[argv.index("get") + 1:]
        if after[0] == TAKEN[SCENARIO]:
            print(f"{singular(after[0])}/{after[1]}")
            return 0
        return fail(f'Error from server (NotFound): {after[0]} "{after[1]}" not found')
    if SCENARIO in OBJECT_ONLY:
        if "create" in argv and not configmap:
            return fail(STDERR[OBJECT_ONLY[SCENARIO]].replace("{secret}", os.environ.get("WANDB_API_KEY", "")))
    elif SCENARIO in STDERR:
        return fail(STDERR[SCENARIO])
    verb = next((a for a in argv if a in ("create", "get", "delete", "logs")), "")
    after = argv[argv.index(verb) + 1:] if verb else []
    if SCENARIO == "nonamespace" and verb == "create":
        return fail('Error from server (NotFound): error when creating "STDIN": namespaces "nope" not found')
    if SCENARIO in MISSING and verb in ("get", "delete") and after[0] != "pods" and "/" not in after[0]:
        words = {"resource": after[0], "plural": after[0].split(".")[0], "name": after[1]}
        message = DELETE_MISSING.get(SCENARIO, MISSING[SCENARIO]) if verb == "delete" else MISSING[SCENARIO]
        return fail(message.format(**words))
    if verb == "create":
        print(f"{NAMES.get(kind.group(1) if kind else '', '?')}/{name_in.group(1) if name_in else '?'}")
    elif verb == "get" and SCENARIO == "not-utf8":
        out(b'{"kind": "TrainJob", "metadata": {"name": "caf\xe9"}}\n')
    elif verb == "get" and SCENARIO == "deep":
        out(b"[" * 200000 + b"]" * 200000 + b"\n")
    elif verb == "get" and after[0] == "pods":
        items = pods_now(os.environ["FAKE_KUBECTL_LOG"])
        if SCENARIO == "pod-status-string":
            items[0]["status"] = "Running"
        listing = EMPTY_LIST if SCENARIO in MISSING else {"apiVersion": "v1", "items": items, "kind": "List",
                                                          "metadata": {"resourceVersion": ""}}
        json_out(listing)
    elif verb == "get" and (len(after) < 2 or after[1].startswith("-")):
        # ``get KIND[,KIND] -o json``: every object of those kinds in the namespace, in kubectl's
        # List (as EMPTY_LIST, recorded); the objects from the file FAKE_KUBECTL_LIST names.
        listed = os.environ.get("FAKE_KUBECTL_LIST")
        with open(listed, encoding="utf-8") if listed else open(os.devnull, encoding="utf-8") as source:
            objects = json.loads(source.read() or "[]")
        kinds = {singular(k).split(".")[0] for k in after[0].split(",")}
        json_out({**EMPTY_LIST, "items": [o for o in objects if str(o.get("kind", "")).lower() in kinds]})
    elif verb == "get":
        # Complete once every pod of the last attempt had its log read (its container ended).
        pods = {str(p["metadata"]["name"]) for p in pods_now(os.environ["FAKE_KUBECTL_LOG"])}  # type: ignore[index]
        complete = "True" if pods <= served(os.environ["FAKE_KUBECTL_LOG"]) else "False"
        status = "Running" if SCENARIO == "status-string" else {"conditions": [
            {"type": "Created", "status": "True", "reason": "JobSetCreated"},
            {"type": "Complete", "status": complete}]}
        json_out({"kind": "TrainJob", "metadata": {"name": "cifar10"}, "status": status})
    elif verb == "delete":
        named = [a for a in after if "/" in a]  # KIND/NAME, as kubectl prints them
        for kind_name, _, name in (a.partition("/") for a in named):
            print(f'{kind_name.split(".")[0]} "{name}" deleted')
        if not named:  # RESOURCE NAME: kubectl names it singular.group
            print(f'{singular(after[0])} "{after[1]}" deleted')
    elif verb == "logs":
        if SCENARIO == "log-latin1":
            out(b"epoch 1 caf\xe9 loss 2.1\n")
        out(f"hello from {argv[-1]}\n".encode())
    return 0


sys.exit(main())
