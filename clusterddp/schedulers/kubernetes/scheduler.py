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
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from typing import IO, Any, Mapping, Sequence

from clusterddp.errors import ClusterDDPError
from clusterddp.redact import register_present, scrub
from clusterddp.registry.store import RunRecord
from clusterddp.schedulers.api import Flag, RenderedRequest, Scheduler, Submitted
from clusterddp.schedulers.common import keep_final
from clusterddp.schedulers.kubernetes.follow import Follow, PodState, finished
from clusterddp.schedulers.kubernetes.launcher import configmap_name
from clusterddp.schedulers.kubernetes.render import render_documents
from clusterddp.sections import k8s_names
from clusterddp.spec import JobSpec
from clusterddp.validate import clip, escape_controls, shown

#: Resource (plural.group) of each flavor's kind, as kubectl get/delete name it.
RESOURCES = {"trainjob": "trainjobs.trainer.kubeflow.org", "jobset": "jobsets.jobset.x-k8s.io",
             "pytorchjob": "pytorchjobs.kubeflow.org"}
#: Pod labels each controller sets, selecting the pods of one object (a TrainJob's JobSet has its name).
POD_SELECTORS = {"trainjob": "jobset.sigs.k8s.io/jobset-name", "jobset": "jobset.sigs.k8s.io/jobset-name",
                 "pytorchjob": "training.kubeflow.org/job-name"}
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TIMEOUT = 60.0
#: The kind of each flavor's resource, as a message names it ("the cluster does not know JobSet"),
#: whichever way kubectl spelt it: ``post jobsets.jobset.x-k8s.io`` (create) or ``resource type
#: "jobsets"`` (get, delete) name the same missing CRD, so the line names it the same way.
KINDS = {"trainjobs.trainer.kubeflow.org": "TrainJob", "jobsets.jobset.x-k8s.io": "JobSet",
         "pytorchjobs.kubeflow.org": "PyTorchJob", "trainjobs": "TrainJob", "jobsets": "JobSet",
         "pytorchjobs": "PyTorchJob"}
#: The object itself is missing (a missing namespace or CRD has its own row).
NOT_FOUND = "{0} not found"
#: A name already taken (``create`` rewords it to name the job that holds it: ``taken`` below).
EXISTS = "{0} already exists in that namespace: stop it first, or set kubernetes.name"
NO_CRD = "the cluster does not know {0}: its CRD is not installed (see docs/kubernetes.md, 'Installing the CRDs')"
#: kubectl's stderr -> one line, first match wins (kubectl v1.32.4's own words, recorded against a
#: real API server: shared/testbeds/kubernetes/README.md). A group that names a flavor's
#: resource is shown as its kind. Order matters: a certificate or credentials problem also reads
#: "Unable to connect"; ``kubectl create`` reports all three as "failed to download openapi",
#: with advice (--validate=false) a clusterddp user cannot follow.
ERRORS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"x509: ([^;\n\"]*)"),
     "the API server's certificate is not trusted ({0}): check the cluster's certificate-authority in the kubeconfig"),
    (re.compile(r"the server has asked for the client to provide credentials|You must be logged in to the server"
                r"|\(Unauthorized\)"),
     "unauthorized: the API server refused the kubeconfig's credentials (an expired or wrong token or "
     "certificate)"),
    (re.compile(r"failed to download openapi: Get \"(\w+://[^/\"]+)[^\"]*\": (?:dial tcp [^ ]+: )?([^;\n]*)"),
     "cannot reach the API server at {0}: {1}"),
    (re.compile(r"The connection to the server (\S+) was refused"), "cannot reach the API server at {0}: connection refused"),
    (re.compile(r"Unable to connect to the server: (?:dial tcp ([^ ]+)|Get \"(\w+://[^/\"]+)[^\"]*\"): ([^\n]*)"),
     "cannot reach the API server at {0}: {1}"),
    (re.compile(r"(Unable to connect to the server[^\n]*)"), "cannot reach the API server: {0}"),
    (re.compile(r"no matches for kind \"(\w+)\"|the server doesn't have a resource type \"(\w+)\""), NO_CRD),
    # A CRD removed while kubectl's discovery cache still lists it (the normal case right after).
    (re.compile(r"the server could not find the requested resource \((?:post|get|delete|list|patch|put) ([^)\s]+)\)"),
     NO_CRD),
    (re.compile(r"\(AlreadyExists\).*\"([^\"]+)\" already exists"), EXISTS),
    (re.compile(r"\(Forbidden\).*?(User \"[^\"]*\" cannot [^\n]*)"), "forbidden: {0}"),
    (re.compile(r"\(NotFound\).*namespaces \"([^\"]+)\" not found"), "namespace {0} does not exist"),
    (re.compile(r"\(NotFound\).*?\"([^\"]+)\" not found"), NOT_FOUND),
    (re.compile(r"(is invalid: [^\n]*)"), "the server refused the object: {0}"),
)
#: A klog line (``E1125 21:09:15.597355   19314 memcache.go:265] ...``): kubectl's internal log,
#: never the message for the user (kubectl prints its real error last).
KLOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^ \]]+:\d+\] ")
#: What ``kubectl create -o name`` prints: ``trainjob.trainer.kubeflow.org/cifar10``.
CREATED = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
#: At most this much of kubectl's output is read as JSON or shown (a list of every pod: a few MB).
MAX_OUTPUT = 64 << 20


class KubectlError(ClusterDDPError):
    """kubectl is missing, or the server refused: one line, exit 2. ``not_found``: the server
    said the object (not its namespace, not its kind) does not exist; ``exists``: the name
    (``exists`` holds it) is taken."""

    not_found: bool = False
    exists: str | None = None


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
        register_present(request.job.env_passthrough, env)  # kubectl may echo one; the CLI masks errors
        created = scrub(create(request, options, env))
        print(created)
        namespace = options.namespace or request.job.kubernetes.namespace
        self.submitted = Submitted(created, "name", where=" ".join(
            f"{key} {value}" for key, value in (("namespace", namespace), ("context", options.context)) if value),
            options={key: value for key, value in (("context", options.context), ("namespace", namespace),
                                                   ("flavor", options.flavor)) if value})
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

    def refresh(self, records: Sequence[RunRecord], env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """One ``kubectl get KINDS -o json`` per context and namespace, for all their runs."""
        changes = refresh(records, env)
        keep_final(records, changes)
        return changes


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
    """kubectl's stderr as one line: a known shape reworded, else its first line that is not
    kubectl's own log (klog), else its last."""
    for pattern, message in ERRORS:
        match = pattern.search(stderr)
        if match:
            found = [KINDS.get(g, escape_controls(g)[:300]) for g in match.groups() if g]
            error = KubectlError("kubectl: " + message.format(*found, *[""] * 2))
            error.not_found = message == NOT_FOUND
            error.exists = found[0] if message == EXISTS else None
            return error
    lines = [line for line in stderr.splitlines() if line.strip()]
    first = next((line for line in lines if not KLOG_LINE.match(line)), lines[-1] if lines else "")
    return KubectlError(f"kubectl failed: {escape_controls(first or f'exit status {returncode}')[:300]}")


def unrunnable(program: str, env: Mapping[str, str], exc: OSError) -> KubectlError:
    """Why ``program`` could not be started, in one line: missing, a directory, not executable,
    or a file that exists but whose ``#!`` interpreter (or ELF loader) does not: exec says
    ENOENT for that too, which is not "not found on PATH"."""
    candidates = [program] if os.sep in program else [
        os.path.join(d or ".", program) for d in env.get("PATH", os.defpath).split(os.pathsep)]
    if isinstance(exc, FileNotFoundError):
        runnable = next((path for path in candidates if os.path.isfile(path) and os.access(path, os.X_OK)), None)
        if runnable is not None:
            return KubectlError(f"{shown(runnable, 200)} exists but cannot be executed: {missing_loader(runnable)}",
                                "fix its #! line, or put a kubectl that runs first on PATH")
        if os.sep not in program:
            return KubectlError(f"{shown(program)} not found on PATH",
                                "install kubectl and point KUBECONFIG at your cluster")
    found = next((path for path in candidates if os.path.lexists(path)), program)
    what = "is a directory" if os.path.isdir(found) else f"cannot be run ({exc.strerror or exc})"
    return KubectlError(f"{shown(found, 200)} {what}", "put an executable kubectl first on PATH")


def missing_loader(path: str) -> str:
    """What exec could not find for the executable file ``path``: its ``#!`` interpreter, named
    (a kubectl wrapper script whose python or shell is gone), else the program loader or a
    library of a binary (the kernel says only ENOENT)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].split()
        if words:
            interpreter = os.fsdecode(words[0])
            if not os.path.lexists(interpreter):
                return f"its interpreter {shown(interpreter, 200)} (its #! line) does not exist"
            return f"its interpreter {shown(interpreter, 200)} (its #! line) cannot be started either"
        return "its #! line names no interpreter"
    return "exec found no program loader or library it needs (No such file or directory)"


def decoded(data: bytes, what: str) -> str:
    """kubectl's output as text: it must be UTF-8 (JSON is); anything else is one line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KubectlError(f"kubectl printed {what} that is not UTF-8 (byte {exc.start})") from None


def run_kubectl(argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None) -> str:
    """Run kubectl (``env`` carries KUBECONFIG), return stdout; a kubectl that cannot run, a
    failure, or output that is not UTF-8 is one KubectlError line."""
    try:
        done = subprocess.run(list(argv), input=None if stdin is None else stdin.encode("utf-8"),
                              capture_output=True, timeout=TIMEOUT, env=dict(env))
    except OSError as exc:
        raise unrunnable(argv[0], env, exc) from None
    except subprocess.TimeoutExpired:
        raise KubectlError(f"kubectl did not answer in {TIMEOUT:.0f} s: cannot reach the API server?") from None
    if done.returncode != 0:
        raise kubectl_error(done.stderr[:MAX_OUTPUT].decode("utf-8", "replace"), done.returncode)
    if len(done.stdout) > MAX_OUTPUT:
        raise KubectlError(f"kubectl printed more than {MAX_OUTPUT >> 20} MiB")
    return decoded(done.stdout, "output")


def create(request: RenderedRequest, options: KubernetesOptions, env: Mapping[str, str]) -> str:
    """``kubectl create -f -`` of each document in turn (the ConfigMap, then the object); when
    one is refused, what was created is deleted again and the refusal is the one line. Returns
    the object as kubectl names it (``trainjob.trainer.kubeflow.org/cifar10``)."""
    documents = request.documents if isinstance(request, KubernetesRequest) else (("", request.text),)
    argv = [*base_argv(options, request.job), "create", "-f", "-", "-o", "name"]
    created: list[str] = []
    for _, text in documents:
        try:
            printed = run_kubectl(argv, env, stdin=text).strip()
            if not CREATED.fullmatch(printed):  # ``undo`` passes it to kubectl delete: no flag, no junk
                raise KubectlError(f"kubectl create printed {shown(printed)}, not the KIND/NAME of what it created")
            created.append(printed)
        except KubectlError as exc:
            if exc.exists is not None:
                exc = taken(request, options, env, exc)
            if created:
                undo(created, options, request.job, env, exc)
            raise exc from None
    return created[-1]


def taken(request: RenderedRequest, options: KubernetesOptions, env: Mapping[str, str],
          cause: KubectlError) -> KubectlError:
    """A second submit of the same job is refused at its first document, the launcher's
    ConfigMap (``configmaps "cifar10-clusterddp" already exists``): the line names the job that
    holds the name instead, asking the server which kind of object it is (this flavor first),
    and how to stop it; a ConfigMap that no object of that name holds is named as left over."""
    job = request.job
    documents = request.documents if isinstance(request, KubernetesRequest) else ()
    kind, _, name = (documents[-1][0] if documents else "").partition("/")
    if kind not in RESOURCES or not name:
        return cause
    where = place(replace(options, namespace=options.namespace or job.kubernetes.namespace))
    for flavor in (kind, *(f for f in RESOURCES if f != kind)):
        try:
            held = run_kubectl([*base_argv(options, job), "get", RESOURCES[flavor], name, "-o", "name"], env).strip()
        except KubectlError:
            continue  # not there, or the cluster lacks that kind: ask the next
        if CREATED.fullmatch(held):
            stop = follow_up("stop", held, options, job)
            return KubectlError(f"kubectl: {flavor} {name} already exists in {where}: stop it first ({stop}), "
                                "or set kubernetes.name")
    if cause.exists == configmap_name(name):
        return KubectlError(f"kubectl: the launcher ConfigMap {cause.exists} of an earlier job {name} is left in "
                            f"{where}, with no trainjob, jobset or pytorchjob {name} there: delete it "
                            f"(kubectl delete configmap/{cause.exists}), or set kubernetes.name")
    return cause


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


def place(options: KubernetesOptions) -> str:
    """The namespace a message names: the flag's, else the kubeconfig context's."""
    return f"namespace {options.namespace}" if options.namespace else "the context's namespace"


def get_object(options: KubernetesOptions, flavor: str, name: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The object as JSON; a missing namespace, CRD or object is one line that names which (a
    pod list in a missing namespace is merely empty, so ``logs`` asks this first)."""
    try:
        return parse_json(run_kubectl([*base_argv(options), "get", RESOURCES[flavor], name, "-o", "json"], env))
    except KubectlError as exc:
        if exc.not_found:
            raise KubectlError(f"kubectl: {flavor} {name} not found in {place(options)}") from None
        raise


def status(options: KubernetesOptions, env: Mapping[str, str]) -> Status:
    flavor, name = target(options)
    obj = get_object(options, flavor, name, env)
    kind = obj.get("kind", flavor)
    return Status(escape_controls(kind if isinstance(kind, str) else flavor)[:100], name, object_phase(obj),
                  tuple(pods_of(base_argv(options), flavor, name, env)))


#: The last condition that holds, as the registry's state (TrainJob: Complete/Failed/Suspended;
#: JobSet: Completed/Failed/Suspended; PyTorchJob: Created/Running/Restarting/Succeeded/Failed).
CONDITION_STATES = {"Complete": "finished", "Completed": "finished", "Succeeded": "finished", "Failed": "failed",
                    "Restarting": "restarting", "Suspended": "pending"}


def refresh(records: Sequence[RunRecord], env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """run id -> changed fields, from one ``kubectl [--context C] [--namespace N] get
    KIND1,KIND2 -o json`` per context and namespace (every kind its runs use, one List)."""
    groups: dict[tuple[str, str], list[tuple[RunRecord, str, str]]] = {}
    for record in records:
        kind, _, name = record.job_id.rpartition("/")
        flavor = kind.split(".", 1)[0].lower() if kind else str(record.scheduler_options.get("flavor") or "trainjob")
        if flavor in RESOURCES and name:
            place_of = (str(record.scheduler_options.get("context") or ""),
                        str(record.scheduler_options.get("namespace") or ""))
            groups.setdefault(place_of, []).append((record, flavor, name))
    changes: dict[str, dict[str, Any]] = {}
    for (context, namespace), group in groups.items():
        options = KubernetesOptions(action="status", context=context or None, namespace=namespace or None)
        kinds = ",".join(sorted({RESOURCES[flavor] for _, flavor, _ in group}))
        try:
            listing = parse_json(run_kubectl([*base_argv(options), "get", kinds, "-o", "json"], env))
            found = {(text(mapping(obj, "an object").get("kind")).lower(),
                      text(mapping(mapping(obj, "an object").get("metadata"), "an object's metadata").get("name"))): obj
                     for obj in items(listing.get("items"), "the list's items")}
        except ClusterDDPError as exc:
            note = f"not checked: {clip(exc.message, 200)}"
            changes.update({record.run_id: {"note": note} for record, _, _ in group})
            continue
        for record, flavor, name in group:
            obj = found.get((flavor, name))
            if obj is not None:
                changes[record.run_id] = object_change(obj)
            elif record.stop_requested is not None:  # 'clusterddp stop' deleted it
                changes[record.run_id] = {"state": "stopped"}
            else:
                changes[record.run_id] = {"note": f"kubectl lists no {flavor} {name} in {place(options)}"}
    return changes


def object_change(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object of the list as record fields: the state its last condition that holds says
    (none yet: pending; one that says nothing of the end: running), attempts from a JobSet's
    ``status.restarts``; an object of another shape is a note."""
    try:
        status = mapping(obj.get("status"), "the object's status")
        held = [c for c in items(status.get("conditions"), "status.conditions")
                if isinstance(c, dict) and c.get("status") == "True"]
    except ClusterDDPError as exc:
        return {"note": clip(exc.message, 200)}
    state = CONDITION_STATES.get(text(held[-1].get("type")), "running") if held else "pending"
    change: dict[str, Any] = {"state": state}
    restarts = status.get("restarts")
    if type(restarts) is int and restarts >= 0:
        change["attempts"] = restarts + 1
    return change


def pods_of(base: Sequence[str], flavor: str, name: str, env: Mapping[str, str]) -> list[PodState]:
    """The object's pods, by the label its controller sets (a TrainJob's JobSet has its name)."""
    selector = f"{POD_SELECTORS[flavor]}={name}"
    return pod_states(parse_json(run_kubectl([*base, "get", "pods", "-l", selector, "-o", "json"], env)))


def stop(options: KubernetesOptions, env: Mapping[str, str]) -> str:
    """Delete the object (its controller deletes the Jobs and pods it owns), then the launcher's
    ConfigMap (none with ``kubernetes.launcher: image``: not an error). kubectl delete says only
    that the object is not found, also when its namespace is missing: then ``get`` names which."""
    flavor, name = target(options)
    base = base_argv(options)
    try:
        deleted = run_kubectl([*base, "delete", RESOURCES[flavor], name, "--wait=false"], env).strip()
    except KubectlError as exc:
        if not exc.not_found:
            raise
        get_object(options, flavor, name, env)  # raises naming the namespace, the CRD or the object
        raise
    also = run_kubectl([*base, "delete", f"configmap/{configmap_name(name)}", "--ignore-not-found", "--wait=false"],
                       env).strip()
    return "\n".join(escape_controls(line) for line in (deleted, also) if line)


def parse_json(text: str) -> dict[str, Any]:
    """kubectl's ``-o json`` output: an object, or one line (kubectl's output is untrusted
    input: a proxy's HTML page, a nesting deeper than the parser's stack)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KubectlError(f"kubectl printed no JSON ({exc.msg} at {exc.pos})") from None
    except RecursionError:
        raise KubectlError("kubectl printed JSON nested too deeply to read") from None
    if not isinstance(value, dict):
        raise KubectlError("kubectl printed JSON that is not an object")
    return value


def mapping(value: Any, what: str) -> Mapping[str, Any]:
    """``value`` when it is an object, ``{}`` when absent; another shape is one line naming ``what``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise KubectlError(f"kubectl printed {what} as {type(value).__name__}, not an object")
    return value


def items(value: Any, what: str) -> list[Any]:
    """``value`` when it is a list, ``[]`` when absent; another shape is one line naming ``what``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise KubectlError(f"kubectl printed {what} as {type(value).__name__}, not a list")
    return value


def text(value: Any, default: str = "") -> str:
    """A scalar of kubectl's JSON shown on one line (a string, a number), at most 200 characters."""
    if value is None:
        return default
    if isinstance(value, (dict, list)):
        return "?"
    return escape_controls(str(value))[:200]


def object_phase(obj: Mapping[str, Any]) -> str:
    """The latest condition that holds (Complete, Failed, Suspended...), with its reason; a
    JobSet's restart count; 'Pending' before the controller wrote any."""
    status = mapping(obj.get("status"), "the object's status")
    held = [c for c in items(status.get("conditions"), "status.conditions")
            if isinstance(c, dict) and c.get("status") == "True"]
    phase = "Pending"
    if held:
        last = held[-1]
        phase = text(last.get("type"), "?")
        if last.get("reason"):
            phase += f" ({text(last['reason'])})"
    if status.get("restarts"):
        phase += f", restarts {text(status['restarts'])}"
    return phase


def index(raw: Any) -> int | None:
    """A completion or replica index as kubectl prints it (a string of digits), else None."""
    return int(raw) if isinstance(raw, str) and raw.isdigit() and len(raw) <= 9 else None


def pod_rank(pod: Mapping[str, Any]) -> int | None:
    """The node rank: a JobSet pod's completion index; a PyTorchJob pod's replica index (+1 for workers)."""
    meta = mapping(pod.get("metadata"), "a pod's metadata")
    labels = mapping(meta.get("labels"), "a pod's labels")
    notes = mapping(meta.get("annotations"), "a pod's annotations")
    raw = notes.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX)
    if raw is None and "training.kubeflow.org/replica-index" in labels:
        rank = index(labels["training.kubeflow.org/replica-index"])
        offset = 1 if labels.get("training.kubeflow.org/replica-type") == "worker" else 0
        return None if rank is None else rank + offset
    return index(raw)


def container_state(pod: Mapping[str, Any]) -> str:
    statuses = items(mapping(pod.get("status"), "a pod's status").get("containerStatuses"),
                     "a pod's containerStatuses")
    if not statuses:
        return "no container yet"
    state = mapping(mapping(statuses[0], "a container status").get("state"), "a container state")
    if "running" in state:
        return "running"
    if "terminated" in state:
        end = mapping(state["terminated"], "a terminated state")
        return f"terminated: exit {text(end.get('exitCode'), 'None')} ({text(end.get('reason'))})"
    if "waiting" in state:
        return f"waiting: {text(mapping(state['waiting'], 'a waiting state').get('reason'))}"
    return "unknown"


def pod_states(pods: Mapping[str, Any]) -> list[PodState]:
    out = []
    for pod in items(pods.get("items"), "the pod list's items"):
        pod = mapping(pod, "a pod")
        name = mapping(pod.get("metadata"), "a pod's metadata").get("name")
        if not isinstance(name, str) or k8s_names.subdomain_problem(name):
            # ``kubectl logs -f NAME`` takes it as an argument: '--help' must not become a flag.
            raise KubectlError(f"kubectl printed a pod whose name is not a Kubernetes name: {shown(name)}")
        phase = text(mapping(pod.get("status"), "a pod's status").get("phase"), "Unknown")
        out.append(PodState(name, pod_rank(pod), phase, container_state(pod)))
    return out


def logs(options: KubernetesOptions, env: Mapping[str, str], out: IO[str] = sys.stdout) -> int:
    """Follow every pod's log, each line prefixed ``[node R]``, and the pods that come later (a
    JobSet restart's): clusterddp.schedulers.kubernetes.follow. Returns when the object is
    finished or gone and every stream has ended. The object is read first: in a missing
    namespace, or without the CRD, kubectl lists no pods and says nothing, which would read as
    'not started yet'."""
    flavor, name = target(options)
    base = base_argv(options)
    get_object(options, flavor, name, env)
    states = pods_of(base, flavor, name, env)
    if not states:
        selector = f"{POD_SELECTORS[flavor]}={name}"
        raise KubectlError(f"no pods of {flavor} {name} yet ({clip(shlex.join([*base, 'get', 'pods', '-l', selector]), 300)})")

    def done() -> bool:
        try:
            return finished(parse_json(run_kubectl([*base, "get", RESOURCES[flavor], name, "-o", "json"], env)))
        except KubectlError as exc:
            if exc.not_found:  # deleted (clusterddp stop): no pod will come
                return True
            raise

    def start(pod: str) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen([*base, "logs", "-f", pod], stdout=subprocess.PIPE, env=dict(env))
        except OSError as exc:
            raise unrunnable(base[0], env, exc) from None

    return Follow(lambda: pods_of(base, flavor, name, env), done, start, out).run(states)
