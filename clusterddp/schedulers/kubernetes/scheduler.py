"""``clusterddp render|submit k8s JOB``, ``clusterddp status|stop|logs k8s [KIND/]NAME``.

``KubernetesScheduler`` (clusterddp.schedulers.api) renders the job file with
clusterddp.schedulers.kubernetes.render and hands the object to the thin kubectl boundary below.

Everything talks to the cluster through ``kubectl`` with the user's own kubeconfig, context
and namespace (``--context``, ``--namespace``, ``KUBECONFIG``), as ``submit slurm`` goes
through ``sbatch``: argv is built here, kubectl's JSON parsed here, and kubectl's documented
error lines turned into one line each (exit 2). The manifest is the launcher's ConfigMap, then
the object (clusterddp.schedulers.kubernetes.launcher); ``submit`` creates them one at a time
with ``kubectl create -f -`` and deletes the ConfigMap when the object is refused, so nothing is
left half-created; ``stop`` deletes the object, then its ConfigMap.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import IO, Any, Mapping, Sequence

from clusterddp.errors import ClusterDDPError
from clusterddp.schedulers.api import Flag, RenderedRequest, Scheduler
from clusterddp.schedulers.kubernetes.launcher import configmap_name
from clusterddp.schedulers.kubernetes.render import render_documents
from clusterddp.sections import k8s_names
from clusterddp.spec import JobSpec
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


def flavor(text: str) -> str:
    """``--flavor``: one of FLAVORS (a ValueError is argparse's one usage line naming the flag)."""
    if text not in RESOURCES:
        raise ValueError(text)
    return text


def namespace(text: str) -> str:
    """``--namespace``: a DNS-1123 label, as ``kubernetes.namespace`` is (it is written into the
    manifest); a ValueError is argparse's one usage line naming the flag."""
    if k8s_names.dns1123_label_problem(text):
        raise ValueError(text)
    return text


@dataclass(frozen=True)
class KubernetesOptions:
    """``clusterddp ACTION k8s ...`` as the CLI parsed it; the job file gives the rest."""

    action: str = "render"
    #: ``render``/``submit``: the job file; the pod runs ``clusterddp run`` on this path.
    job: str | None = None
    #: ``status``/``stop``/``logs``: the object, as ``submit`` printed it (``KIND/NAME``) or its name.
    name: str | None = None
    #: trainjob, jobset or pytorchjob; None: the job's ``kubernetes.flavor`` (trainjob).
    flavor: str | None = None
    context: str | None = None
    #: Wins over ``kubernetes.namespace``; None: that, else the kubeconfig context's namespace.
    namespace: str | None = None
    #: ``render``: write the manifest here instead of stdout.
    output: str | None = None
    #: ``submit``: print the manifest and the kubectl command, create nothing.
    dry_run: bool = False
    kubectl: str = "kubectl"


_REMOTE = ("submit", "status", "stop", "logs")


@dataclass(frozen=True)
class KubernetesRequest(RenderedRequest):
    """The manifest, and its documents one by one as (``kind/name``, YAML) in creation order."""

    documents: tuple[tuple[str, str], ...] = ()


class KubernetesScheduler(Scheduler[KubernetesOptions]):
    """A TrainJob, JobSet or PyTorchJob rendered from the job file, handled through kubectl."""

    name = "k8s"
    actions = ("render", "submit", "status", "stop", "logs")
    options_type = KubernetesOptions
    descriptions = {
        "render": "Render the job file as a Kubernetes TrainJob, JobSet or PyTorchJob.",
        "submit": "Render the job file and create the object with 'kubectl create'.",
        "status": "Show the object's phase and each pod's state.",
        "stop": "Delete the object (its controller deletes its Jobs and pods).",
        "logs": "Follow every pod's log, each line prefixed with its node rank.",
    }
    flags = (
        Flag("job", help="job file (jobs/*.yaml), at the same path inside the image", actions=("render", "submit")),
        Flag("name", metavar="[KIND/]NAME", help="the object 'submit' printed, or its name (with --flavor)",
             actions=("status", "stop", "logs")),
        Flag("flavor", ("--flavor",), convert=flavor, metavar="trainjob|jobset|pytorchjob",
             help="the kind of object (default: the job's kubernetes.flavor, else trainjob)"),
        Flag("output", ("-o", "--output"), help="write the manifest here instead of printing it", actions=("render",)),
        Flag("context", ("--context",), help="kubeconfig context (default: its current one)", actions=_REMOTE),
        Flag("namespace", ("--namespace",), convert=namespace,
             help="namespace of every object (default: kubernetes.namespace, else the context's namespace)"),
        Flag("dry_run", ("--dry-run",), switch=True, actions=("submit",),
             help="print the manifest and the kubectl command, create nothing"),
    )

    def render(self, job: JobSpec, options: KubernetesOptions) -> RenderedRequest:
        """The manifest, with the job path as given: the pod runs it in the image's working
        directory. ``--namespace`` wins over ``kubernetes.namespace`` in every object (kubectl
        refuses an object whose namespace differs from its own ``--namespace``)."""
        if options.namespace:
            job = replace(job, kubernetes=replace(job.kubernetes, namespace=options.namespace))
        header, documents = render_documents(job, str(options.job), options.flavor)
        command = shlex.join([*base_argv(options, job), "create", "-f", "-", "-o", "name"])
        manifest = header + "".join(text for _, text in documents)
        return KubernetesRequest(manifest, command + " < MANIFEST", job, tuple(documents))

    def wrote(self, request: RenderedRequest, path: str) -> None:
        print(f"wrote {path}; create it with: kubectl create -f {shlex.quote(path)}", file=sys.stderr)

    def submit(self, request: RenderedRequest, options: KubernetesOptions, env: Mapping[str, str]) -> int:
        """``kubectl create``: prints the object as kubectl names it (what status/stop/logs take)."""
        if options.dry_run:
            sys.stdout.write(request.text)
            print(f"# dry run: would run: {request.submit_command}")
            return 0
        created = create(request, options, env)
        print(created)
        print(f"clusterddp: created; follow it with: {follow_up('logs', created, options, request.job)}",
              file=sys.stderr)
        return 0

    def status(self, options: KubernetesOptions, env: Mapping[str, str]) -> int:
        for line in status(options, env).lines():
            print(line)
        return 0

    def stop(self, options: KubernetesOptions, env: Mapping[str, str]) -> int:
        print(stop(options, env))
        return 0

    def logs(self, options: KubernetesOptions, env: Mapping[str, str]) -> int:
        return logs(options, env)


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


def follow_up(action: str, name: str, options: KubernetesOptions, job: JobSpec | None = None) -> str:
    """``clusterddp ACTION k8s NAME`` with the context and namespace this command used, shell-quoted:
    a hint a user pastes finds the same object (``status``/``logs`` read no job file, so the
    job file's namespace must be spelled out)."""
    argv = ["clusterddp", action, "k8s", name]
    if options.context:
        argv += ["--context", options.context]
    chosen = options.namespace or (job.kubernetes.namespace if job else None)
    if chosen:
        argv += ["--namespace", chosen]
    return shlex.join(argv)


def kubectl_error(stderr: str, returncode: int) -> KubectlError:
    """kubectl's stderr as one line: a known shape reworded, else its first line."""
    for pattern, message in ERRORS:
        match = pattern.search(stderr)
        if match:
            found = next((g for g in match.groups() if g), "")
            return KubectlError("kubectl: " + message.format(escape_controls(found)[:300]))
    first = next((line for line in stderr.splitlines() if line.strip()), f"exit status {returncode}")
    return KubectlError(f"kubectl failed: {escape_controls(first)[:300]}")


def run_kubectl(argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None) -> str:
    """Run kubectl (``env`` carries KUBECONFIG), return stdout; a missing kubectl or a failure
    is one KubectlError line."""
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=TIMEOUT, env=dict(env))
    except FileNotFoundError:
        raise KubectlError(f"{shown(argv[0])} not found on PATH", "install kubectl and point KUBECONFIG at "
                           "your cluster") from None
    except subprocess.TimeoutExpired:
        raise KubectlError(f"kubectl did not answer in {TIMEOUT:.0f} s: cannot reach the API server?") from None
    if done.returncode != 0:
        raise kubectl_error(done.stderr, done.returncode)
    return done.stdout


def create(request: RenderedRequest, options: KubernetesOptions, env: Mapping[str, str]) -> str:
    """``kubectl create -f -`` of each document in turn (the ConfigMap, then the object); when
    one is refused, what was created is deleted again and the refusal is the one line. Returns
    the object as kubectl names it (``trainjob.trainer.kubeflow.org/cifar10``)."""
    documents = request.documents if isinstance(request, KubernetesRequest) else (("", request.text),)
    argv = [*base_argv(options, request.job), "create", "-f", "-", "-o", "name"]
    created: list[str] = []
    for _, text in documents:
        try:
            created.append(run_kubectl(argv, env, stdin=text).strip())
        except KubectlError as exc:
            if created:
                undo(created, options, request.job, env, exc)
            raise
    return created[-1]


def undo(created: list[str], options: KubernetesOptions, job: JobSpec, env: Mapping[str, str],
         cause: KubectlError) -> None:
    """Delete what a refused submit created; when that fails too, one line says both."""
    try:
        run_kubectl([*base_argv(options, job), "delete", *created, "--ignore-not-found", "--wait=false"], env)
    except KubectlError as again:
        raise KubectlError(f"{cause}; and {', '.join(created)} is left behind ({again}): delete it by hand") from None


def target(options: KubernetesOptions) -> tuple[str, str]:
    """(flavor, name) of the object ``status``/``stop``/``logs`` name: ``KIND/NAME`` as submit
    printed it (``jobset.jobset.x-k8s.io/cifar10``), or NAME with ``--flavor`` (trainjob)."""
    given = str(options.name or "")
    kind, _, name = given.rpartition("/")
    flavor = options.flavor or "trainjob"
    if kind:
        named = kind.split(".", 1)[0].lower().removesuffix("s")
        if named not in RESOURCES:
            raise KubectlError(f"{shown(given)}: unknown kind {shown(kind)}; known: {', '.join(RESOURCES)}")
        if options.flavor and options.flavor != named:
            raise KubectlError(f"{shown(given)} is a {named}, but --flavor says {options.flavor}")
        flavor = named
    problem = k8s_names.dns1123_label_problem(name)
    if problem:
        raise KubectlError(f"object name {problem}", "give the name 'submit k8s' printed")
    return flavor, name


def status(options: KubernetesOptions, env: Mapping[str, str]) -> Status:
    flavor, name = target(options)
    base = base_argv(options)
    obj = parse_json(run_kubectl([*base, "get", RESOURCES[flavor], name, "-o", "json"], env))
    return Status(str(obj.get("kind", flavor)), name, object_phase(obj), tuple(pods_of(base, flavor, name, env)))


def pods_of(base: Sequence[str], flavor: str, name: str, env: Mapping[str, str]) -> list[PodState]:
    """The object's pods, by the label its controller sets (a TrainJob's JobSet has its name)."""
    selector = f"{POD_SELECTORS[flavor]}={name}"
    return pod_states(parse_json(run_kubectl([*base, "get", "pods", "-l", selector, "-o", "json"], env)))


def stop(options: KubernetesOptions, env: Mapping[str, str]) -> str:
    """Delete the object (its controller deletes the Jobs and pods it owns), then the launcher's
    ConfigMap (none with ``kubernetes.launcher: image``: not an error)."""
    flavor, name = target(options)
    base = base_argv(options)
    deleted = run_kubectl([*base, "delete", RESOURCES[flavor], name, "--wait=false"], env).strip()
    also = run_kubectl([*base, "delete", f"configmap/{configmap_name(name)}", "--ignore-not-found", "--wait=false"],
                       env).strip()
    return "\n".join(line for line in (deleted, also) if line)


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


def logs(options: KubernetesOptions, env: Mapping[str, str], out: IO[str] = sys.stdout) -> int:
    """Follow every pod's log, each line prefixed ``[node R]``; returns when all streams end."""
    flavor, name = target(options)
    base = base_argv(options)
    states = pods_of(base, flavor, name, env)
    if not states:
        selector = f"{POD_SELECTORS[flavor]}={name}"
        raise KubectlError(f"no pods of {flavor} {name} yet ({shlex.join([*base, 'get', 'pods', '-l', selector])})")
    lock = threading.Lock()
    procs = [(s, subprocess.Popen([*base, "logs", "-f", s.name], stdout=subprocess.PIPE, text=True, env=dict(env)))
             for s in states]

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
