"""``clusterddp render|submit|status|stop|logs k8s JOB``: the thin kubectl boundary.

Everything talks to the cluster through ``kubectl`` with the user's own kubeconfig, context
and namespace (``--context``, ``--namespace``, ``KUBECONFIG``), as ``submit slurm`` goes
through ``sbatch``: argv is built here, kubectl's JSON parsed here, and kubectl's documented
error lines turned into one line each (exit 2). The object is one document created with
``kubectl create -f -``, so a refused create leaves nothing half-created.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO, Any, Mapping, Sequence

from clusterddp.errors import ClusterDDPError
from clusterddp.schedulers import write_output
from clusterddp.schedulers.kubernetes_render import object_name, render_kubernetes
from clusterddp.schedulers import quoting as q
from clusterddp.spec import JobSpec, load_job
from clusterddp.validate import escape_controls, shown

#: Resource (plural.group) of each flavor's kind, as kubectl get/delete name it.
RESOURCES = {"trainjob": "trainjobs.trainer.kubeflow.org", "jobset": "jobsets.jobset.x-k8s.io",
             "pytorchjob": "pytorchjobs.kubeflow.org"}
#: Pod labels each controller sets, selecting the pods of one object (a TrainJob's JobSet has its name).
POD_SELECTORS = {"trainjob": "jobset.sigs.k8s.io/jobset-name", "jobset": "jobset.sigs.k8s.io/jobset-name",
                 "pytorchjob": "training.kubeflow.org/job-name"}
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TIMEOUT = 60.0
#: kubectl's stderr -> one line (documented shapes: apimachinery StatusReason, kubectl's own errors).
ERRORS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"no matches for kind \"(\w+)\"|the server doesn't have a resource type \"(\w+)\""),
     "the cluster does not know {0}: its CRD is not installed (see docs/kubernetes.md, 'Installing the CRDs')"),
    (re.compile(r"\(AlreadyExists\).*\"([^\"]+)\" already exists"),
     "{0} already exists in that namespace: stop it first, or set kubernetes.name"),
    (re.compile(r"\(Forbidden\).*?(User \"[^\"]*\" cannot [^\n]*)"), "forbidden: {0}"),
    (re.compile(r"\(NotFound\).*namespaces \"([^\"]+)\" not found"), "namespace {0} does not exist"),
    (re.compile(r"\(NotFound\).*?\"([^\"]+)\" not found"), "{0} not found"),
    (re.compile(r"(Unable to connect to the server[^\n]*|The connection to the server \S+ was refused)"),
     "cannot reach the API server: {0}"),
    (re.compile(r"(is invalid: [^\n]*)"), "the server refused the object: {0}"),
)


class KubectlError(ClusterDDPError):
    """kubectl is missing, or the server refused: one line, exit 2."""


@dataclass(frozen=True)
class KubernetesOptions:
    """The scheduler's own flags; the job file gives the rest."""

    job: str
    flavor: str | None = None
    context: str | None = None
    namespace: str | None = None
    #: ``render``: write the manifest here instead of stdout.
    output: str | None = None
    kubectl: str = "kubectl"


@dataclass(frozen=True)
class PodState:
    name: str
    rank: int | None
    phase: str
    #: 'running', 'waiting: ImagePullBackOff', 'terminated: exit 1 (Error)'.
    container: str


@dataclass(frozen=True)
class Status:
    kind: str
    name: str
    phase: str
    pods: tuple[PodState, ...] = field(default=())

    def lines(self) -> list[str]:
        out = [f"{self.kind}/{self.name}: {self.phase}"]
        for pod in sorted(self.pods, key=lambda p: (p.rank is None, p.rank or 0, p.name)):
            rank = "?" if pod.rank is None else str(pod.rank)
            out.append(f"  node {rank}: {pod.name} {pod.phase} ({pod.container})")
        return out


def base_argv(options: KubernetesOptions, job: JobSpec | None = None) -> list[str]:
    """kubectl [--context C] [--namespace N]: the flag wins over ``kubernetes.namespace``."""
    argv = [options.kubectl]
    if options.context:
        argv += ["--context", options.context]
    namespace = options.namespace or (job.kubernetes.namespace if job else None)
    if namespace:
        argv += ["--namespace", namespace]
    return argv


def flavor_of(job: JobSpec, options: KubernetesOptions) -> str:
    return options.flavor or job.kubernetes.flavor


def kubectl_error(stderr: str, returncode: int) -> KubectlError:
    """kubectl's stderr as one line: a known shape reworded, else its first line."""
    for pattern, message in ERRORS:
        match = pattern.search(stderr)
        if match:
            found = next((g for g in match.groups() if g), "")
            return KubectlError("kubectl: " + message.format(escape_controls(found)[:300]))
    first = next((line for line in stderr.splitlines() if line.strip()), f"exit status {returncode}")
    return KubectlError(f"kubectl failed: {escape_controls(first)[:300]}")


def run_kubectl(argv: Sequence[str], stdin: str | None = None) -> str:
    """Run kubectl, return stdout; missing kubectl or a failure is one KubectlError line."""
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=TIMEOUT)
    except FileNotFoundError:
        raise KubectlError(f"{shown(argv[0])} not found on PATH", "install kubectl and point KUBECONFIG at "
                           "your cluster") from None
    except subprocess.TimeoutExpired:
        raise KubectlError(f"kubectl did not answer in {TIMEOUT:.0f} s: cannot reach the API server?") from None
    if done.returncode != 0:
        raise kubectl_error(done.stderr, done.returncode)
    return done.stdout


def render(job: JobSpec, options: KubernetesOptions) -> str:
    """The manifest; ``options.job`` is how the pod finds the job file (docs/kubernetes.md)."""
    return render_kubernetes(job, options.job, options.flavor)


def submit(options: KubernetesOptions) -> str:
    """Create the object; returns its name as kubectl prints it (``trainjob.../cifar10``)."""
    job = load_job(options.job)
    manifest = render(job, options)
    out = run_kubectl([*base_argv(options, job), "create", "-f", "-", "-o", "name"], stdin=manifest)
    return out.strip()


def _target(options: KubernetesOptions) -> tuple[JobSpec, str, str]:
    job = load_job(options.job)
    flavor = flavor_of(job, options)
    if flavor not in RESOURCES:
        raise KubectlError(f"unknown flavor {shown(flavor)}; known: {', '.join(RESOURCES)}")
    return job, flavor, object_name(job, q.place(job.source, options.job), flavor)


def status(options: KubernetesOptions) -> Status:
    job, flavor, name = _target(options)
    base = base_argv(options, job)
    obj = parse_json(run_kubectl([*base, "get", RESOURCES[flavor], name, "-o", "json"]))
    pods = parse_json(run_kubectl([*base, "get", "pods", "-l", f"{POD_SELECTORS[flavor]}={name}", "-o", "json"]))
    return Status(str(obj.get("kind", flavor)), name, object_phase(obj), tuple(pod_states(pods)))


def stop(options: KubernetesOptions) -> str:
    """Delete the object (its controller deletes the Jobs and pods it owns)."""
    job, flavor, name = _target(options)
    return run_kubectl([*base_argv(options, job), "delete", RESOURCES[flavor], name, "--wait=false"]).strip()


def parse_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KubectlError(f"kubectl printed no JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(value, dict):
        raise KubectlError("kubectl printed JSON that is not an object")
    return value


def object_phase(obj: Mapping[str, Any]) -> str:
    """The latest condition that holds (Complete, Failed, Suspended...), with its reason; a
    JobSet's restart count; 'Pending' before the controller wrote any."""
    status = obj.get("status") or {}
    held = [c for c in status.get("conditions") or () if isinstance(c, dict) and c.get("status") == "True"]
    phase = "Pending"
    if held:
        last = held[-1]
        phase = str(last.get("type"))
        if last.get("reason"):
            phase += f" ({last['reason']})"
    if status.get("restarts"):
        phase += f", restarts {status['restarts']}"
    return escape_controls(phase)


def pod_rank(pod: Mapping[str, Any]) -> int | None:
    """The node rank: a JobSet pod's completion index; a PyTorchJob pod's replica index (+1 for workers)."""
    meta = pod.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    raw = notes.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX)
    if raw is None and "training.kubeflow.org/replica-index" in labels:
        raw = labels["training.kubeflow.org/replica-index"]
        offset = 1 if labels.get("training.kubeflow.org/replica-type") == "worker" else 0
        return int(raw) + offset if str(raw).isdigit() else None
    return int(raw) if raw is not None and str(raw).isdigit() else None


def container_state(pod: Mapping[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or ()
    if not statuses:
        return "no container yet"
    state = statuses[0].get("state") or {}
    if "running" in state:
        return "running"
    if "terminated" in state:
        end = state["terminated"]
        return f"terminated: exit {end.get('exitCode')} ({end.get('reason', '')})"
    if "waiting" in state:
        return f"waiting: {state['waiting'].get('reason', '')}"
    return "unknown"


def pod_states(pods: Mapping[str, Any]) -> list[PodState]:
    out = []
    for pod in pods.get("items") or ():
        name = str((pod.get("metadata") or {}).get("name", "?"))
        phase = str((pod.get("status") or {}).get("phase", "Unknown"))
        out.append(PodState(escape_controls(name), pod_rank(pod), escape_controls(phase),
                            escape_controls(container_state(pod))))
    return out


def logs(options: KubernetesOptions, out: IO[str] = sys.stdout) -> int:
    """Follow every pod's log, each line prefixed ``[node R]``; returns when all streams end."""
    job, flavor, name = _target(options)
    base = base_argv(options, job)
    pods = parse_json(run_kubectl([*base, "get", "pods", "-l", f"{POD_SELECTORS[flavor]}={name}", "-o", "json"]))
    states = pod_states(pods)
    if not states:
        raise KubectlError(f"no pods of {flavor} {name} yet (kubectl get pods -l {POD_SELECTORS[flavor]}={name})")
    lock = threading.Lock()
    procs = [(s, subprocess.Popen([*base, "logs", "-f", s.name], stdout=subprocess.PIPE, text=True)) for s in states]

    def pump(state: PodState, stream: IO[str]) -> None:
        prefix = f"[node {'?' if state.rank is None else state.rank}] "
        for line in stream:
            with lock:
                out.write(prefix + line)
                out.flush()

    threads = [threading.Thread(target=pump, args=(s, p.stdout), daemon=True) for s, p in procs if p.stdout]
    for thread in threads:
        thread.start()
    codes = [proc.wait() for _, proc in procs]
    for thread in threads:
        thread.join()
    return max(codes, default=0)


def main_render(options: KubernetesOptions) -> int:
    text = render(load_job(options.job), options)
    if options.output:
        write_output(options.output, text)
    else:
        sys.stdout.write(text)
    return 0
