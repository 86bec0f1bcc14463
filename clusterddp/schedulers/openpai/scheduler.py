"""``clusterddp render|submit|status|stop openpai``: options in, one renderer or REST call out.

The job file is rendered with its path as given (relative paths are how the task's shell
finds it after the setup lines, e.g. ``git clone ... && cd repo``). The token comes from
``CLUSTERDDP_OPENPAI_TOKEN`` or ``--token-file``; the URL from ``--url`` or
``CLUSTERDDP_OPENPAI_URL``.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from clusterddp.errors import ClusterDDPError, SubmitError
from clusterddp.registry.store import RunRecord
from clusterddp.redact import scrub
from clusterddp.schedulers.api import Flag, RenderedRequest, Scheduler, Submitted, seconds
from clusterddp.schedulers.common import keep_final
from clusterddp.schedulers.openpai.render import render_openpai
from clusterddp.schedulers.openpai.rest import (
    TOKEN_ENV,
    URL_ENV,
    OpenPAIClient,
    base_url,
    environment_url,
    read_token,
)
from clusterddp.spec import JobSpec
from clusterddp.topology import is_loopback

__all__ = ["OpenPAIOptions", "OpenPAIScheduler", "render_openpai"]

_REMOTE = ("submit", "status", "stop")


@dataclass(frozen=True)
class OpenPAIOptions:
    """``clusterddp render|submit|status|stop openpai`` as the CLI parsed it."""

    action: str
    #: ``render``/``submit``: the job file, as the task finds it after the setup lines.
    job: str | None = None
    #: ``status``/``stop``: the id ``submit`` printed (USER~JOB).
    job_id: str | None = None
    #: OpenPAI job name (default: openpai.name, else the job's name).
    name: str | None = None
    #: ``render``: write the spec here instead of printing it.
    output: str | None = None
    #: The web portal (else CLUSTERDDP_OPENPAI_URL); the token file (else CLUSTERDDP_OPENPAI_TOKEN).
    url: str | None = None
    token_file: str | None = None
    timeout: float = 30.0
    #: ``submit``: print the spec and the request, send nothing.
    dry_run: bool = False
    #: ``status``: print the server's whole answer.
    json: bool = False


class OpenPAIScheduler(Scheduler[OpenPAIOptions]):
    """A protocol-v2 job rendered from the job file; submit, status and stop over REST."""

    name = "openpai"
    actions = ("render", "submit", "status", "stop")
    options_type = OpenPAIOptions
    descriptions = {
        "render": "Render the job file as an OpenPAI protocol-v2 job.",
        "submit": "Render the job file and submit it to OpenPAI's REST server.",
        "status": "Show an OpenPAI job's state.",
        "stop": "Stop an OpenPAI job.",
    }
    flags = (
        Flag("job", help="job file (jobs/*.yaml), as the task finds it after the setup lines",
             actions=("render", "submit")),
        Flag("name", ("--name",), help="OpenPAI job name (default: openpai.name, else the job's name)",
             actions=("render", "submit")),
        Flag("job_id", metavar="USER~JOB", help="the id 'submit' printed", actions=("status", "stop")),
        Flag("output", ("-o", "--output"), help="write the spec here instead of printing it", actions=("render",)),
        Flag("url", ("--url",), help=f"the OpenPAI web portal, e.g. https://pai.example (or {URL_ENV})",
             actions=_REMOTE),
        Flag("token_file", ("--token-file",), help=f"file holding the bearer token (default: ${TOKEN_ENV})",
             actions=_REMOTE),
        Flag("timeout", ("--timeout",), convert=seconds, default=30.0, help="seconds to wait for the server",
             actions=_REMOTE),
        Flag("dry_run", ("--dry-run",), switch=True, help="print the spec and the request, send nothing",
             actions=("submit",)),
        Flag("json", ("--json",), switch=True, help="print the server's whole answer", actions=("status",)),
    )

    def render(self, job: JobSpec, options: OpenPAIOptions) -> RenderedRequest:
        """The spec, with the job path as given: the task's shell finds it after the setup lines."""
        spec = render_openpai(job, str(options.job), name=options.name)
        return RenderedRequest(spec, "POST text/yaml to <url>/rest-server/api/v2/jobs, with a bearer token", job)

    def wrote(self, request: RenderedRequest, path: str) -> None:
        print(f"wrote {path}; submit it in the web portal, or with 'clusterddp submit openpai'", file=sys.stderr)

    def submit(self, request: RenderedRequest, options: OpenPAIOptions, env: Mapping[str, str]) -> int:
        """POST the spec (or, with ``--dry-run``, print where it would go); prints the job id."""
        if request.job.env_passthrough:
            print(f"clusterddp: warning: env_passthrough ({', '.join(request.job.env_passthrough)}) is not sent "
                  "to OpenPAI: the container must provide these variables itself", file=sys.stderr)
        job_id = _submit(request.text, options, env)
        if job_id is not None:
            url = environment_url(options.url, env) or ""
            self.submitted = Submitted(job_id, "job_id", where=url, options={
                key: value for key, value in (("url", url), ("token_file", options.token_file),
                                              ("timeout", options.timeout)) if value})
        return 0

    def status(self, options: OpenPAIOptions, env: Mapping[str, str]) -> int:
        return _status(_client(options, env), str(options.job_id), options.json)

    def refresh(self, records: Sequence[RunRecord], env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """One ``GET /api/v2/jobs?username=USER`` per cluster and user, for all their runs."""
        groups: dict[tuple[str, str, float, str], list[RunRecord]] = {}
        for record in records:
            user, _, name = record.job_id.partition("~")
            options = record.scheduler_options
            if name and options.get("url"):
                key = (str(options["url"]), str(options.get("token_file") or ""),
                       float(options.get("timeout") or 30.0), user)
                groups.setdefault(key, []).append(record)
        changes: dict[str, dict[str, Any]] = {}
        for (url, token_file, timeout, user), group in groups.items():
            try:
                listed = OpenPAIClient(url, read_token(token_file or None, env), timeout=timeout).jobs_of(user)
            except ClusterDDPError as exc:
                changes.update({r.run_id: {"note": f"not checked: {scrub(exc.message)}"} for r in group})
                continue
            found = {str(job.get("name")): job for job in listed if job.get("username", user) == user}
            for record in group:
                job = found.get(record.job_id.partition("~")[2])
                changes[record.run_id] = (job_change(job) if job is not None else
                                          {"note": f"OpenPAI at {base_url(url)} does not list {record.job_id}"})
        keep_final(records, changes)
        return changes

    def stop(self, options: OpenPAIOptions, env: Mapping[str, str]) -> int:
        job_id = str(options.job_id)
        _client(options, env).stop(job_id)
        print(f"clusterddp: asked OpenPAI to stop {job_id}", file=sys.stderr)
        return 0


def _submit(spec: str, options: OpenPAIOptions, env: Mapping[str, str]) -> str | None:
    url = environment_url(options.url, env)
    if options.dry_run:
        endpoint = base_url(url) + "/api/v2/jobs" if url else "<url>/rest-server/api/v2/jobs"
        print(f"# dry run: would POST this to {endpoint} as text/yaml, "
              f"with Authorization: Bearer <token from {'--token-file' if options.token_file else TOKEN_ENV}>")
        sys.stdout.write(scrub(spec))
        return None
    job_id = _client(options, env).submit(spec)
    print(job_id)
    print(f"clusterddp: submitted; follow it with: clusterddp status openpai {job_id} --url {url}",
          file=sys.stderr)
    return job_id


def _client(options: OpenPAIOptions, env: Mapping[str, str]) -> OpenPAIClient:
    url = environment_url(options.url, env)
    if url is None:
        raise SubmitError(f"no OpenPAI address: pass --url or set {URL_ENV}")
    client = OpenPAIClient(url, read_token(options.token_file, env), timeout=options.timeout)
    parts = urllib.parse.urlsplit(client.url)
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        print(f"clusterddp: warning: {client.url} is plain http: the token crosses the network unencrypted",
              file=sys.stderr)
    return client


def _status(client: OpenPAIClient, job_id: str, as_json: bool) -> int:
    data = client.status(job_id)
    if as_json:
        print(scrub(json.dumps(data, indent=2, sort_keys=True)))
        return 0
    for line in status_lines(job_id, data):
        print(scrub(line))
    return 0


def status_lines(job_id: str, data: dict[str, Any]) -> list[str]:
    """``USER~JOB STATE`` then one line per task: role[index] state ip exit-code."""
    job = data.get("jobStatus") or {}
    head = f"{job_id} {job.get('state', 'UNKNOWN')}"
    if job.get("retries"):
        head += f" (retries {job['retries']})"
    if job.get("appExitCode") not in (None, 0):
        head += f" exit code {job['appExitCode']}"
    lines = [head]
    for role, info in (data.get("taskRoles") or {}).items():
        for task in (info or {}).get("taskStatuses") or []:
            parts = [f"  {role}[{task.get('taskIndex', '?')}]", str(task.get("taskState", "?"))]
            if task.get("containerIp"):
                parts.append(str(task["containerIp"]))
            if task.get("containerExitCode") not in (None, 0):
                parts.append(f"exit code {task['containerExitCode']}")
            lines.append(" ".join(parts))
    return lines


#: OpenPAI's job states (``convertState`` of its REST server) as the registry's.
STATES = {"WAITING": "pending", "RUNNING": "running", "STOPPING": "running", "SUCCEEDED": "finished",
          "FAILED": "failed", "STOPPED": "stopped"}


def job_change(job: Mapping[str, Any]) -> dict[str, Any]:
    """A job summary of ``GET /api/v2/jobs`` as record fields: its state (WAITING after a retry
    is ``restarting``: the job waits for its next attempt), attempts (retries + 1), the exit
    code once it is over; an unknown state changes nothing."""
    retries = job.get("retries")
    retries = retries if type(retries) is int and retries >= 0 else 0
    state = STATES.get(str(job.get("state")))
    if state is None:
        return {"note": f"OpenPAI says {scrub(str(job.get('state')))[:40]}"}
    if state == "pending" and retries:
        state = "restarting"
    change: dict[str, Any] = {"state": state, "attempts": retries + 1}
    code = job.get("appExitCode")
    if state in ("finished", "failed", "stopped") and type(code) is int:
        change["exit_code"] = code
    return change
