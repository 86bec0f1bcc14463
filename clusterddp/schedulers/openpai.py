"""``clusterddp render|submit|status|stop openpai``: options in, one renderer or REST call out.

The job file is rendered with its path as given (relative paths are how the task's shell
finds it after the setup lines, e.g. ``git clone ... && cd repo``). The token comes from
``CLUSTERDDP_OPENPAI_TOKEN`` or ``--token-file``; the URL from ``--url`` or
``CLUSTERDDP_OPENPAI_URL``.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from dataclasses import dataclass
from typing import Any, Mapping

from clusterddp.errors import SubmitError
from clusterddp.redact import scrub
from clusterddp.schedulers import write_output
from clusterddp.schedulers.openpai_render import render_openpai
from clusterddp.schedulers.openpai_rest import (
    TOKEN_ENV,
    URL_ENV,
    OpenPAIClient,
    base_url,
    environment_url,
    read_token,
)
from clusterddp.spec import load_job
from clusterddp.topology import is_loopback

ACTIONS = ("render", "submit", "status", "stop")

__all__ = ["OpenPAIOptions", "main", "render_openpai"]


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


def check_action(action: str) -> None:
    """Refuse an action openpai does not have (before any flag is read)."""
    if action not in ACTIONS:
        raise SubmitError(f"openpai supports {', '.join(ACTIONS)}, not {action!r}")


def main(options: OpenPAIOptions, env: Mapping[str, str] | None = None) -> int:
    """Run one action; errors are raised as ClusterDDPError for the CLI to print as one line."""
    check_action(options.action)
    env = os.environ if env is None else env
    if options.action in ("render", "submit"):
        job_path = str(options.job)
        job = load_job(job_path)
        spec = render_openpai(job, job_path, name=options.name)
        if options.action == "render":
            return _render(spec, options.output)
        if job.env_passthrough:
            print(f"clusterddp: warning: env_passthrough ({', '.join(job.env_passthrough)}) is not sent to OpenPAI: "
                  "the container must provide these variables itself", file=sys.stderr)
        return _submit(spec, options, env)
    job_id = str(options.job_id)
    client = _client(options, env)
    if options.action == "status":
        return _status(client, job_id, options.json)
    client.stop(job_id)
    print(f"clusterddp: asked OpenPAI to stop {job_id}", file=sys.stderr)
    return 0


def _render(spec: str, output: str | None) -> int:
    if output is None:
        sys.stdout.write(spec)
        return 0
    write_output(output, spec)
    print(f"wrote {output}; submit it in the web portal, or with 'clusterddp submit openpai'", file=sys.stderr)
    return 0


def _submit(spec: str, options: OpenPAIOptions, env: Mapping[str, str]) -> int:
    url = environment_url(options.url, env)
    if options.dry_run:
        endpoint = base_url(url) + "/api/v2/jobs" if url else "<url>/rest-server/api/v2/jobs"
        print(f"# dry run: would POST this to {endpoint} as text/yaml, "
              f"with Authorization: Bearer <token from {'--token-file' if options.token_file else TOKEN_ENV}>")
        sys.stdout.write(scrub(spec))
        return 0
    job_id = _client(options, env).submit(spec)
    print(job_id)
    print(f"clusterddp: submitted; follow it with: clusterddp status openpai {job_id} --url {url}",
          file=sys.stderr)
    return 0


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
