"""``clusterddp render|submit|status|stop openpai``: flags in, one renderer or REST call out.

The job file is rendered with its path as given (relative paths are how the task's shell
finds it after the setup lines, e.g. ``git clone ... && cd repo``). The token comes from
``CLUSTERDDP_OPENPAI_TOKEN`` or ``--token-file``; the URL from ``--url`` or
``CLUSTERDDP_OPENPAI_URL``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from typing import Any, Mapping

from clusterddp.errors import SubmitError
from clusterddp.redact import scrub
from clusterddp.schedulers import OneLineParser, write_output
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

__all__ = ["main", "render_openpai", "build_parser"]


def build_parser(action: str) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=f"clusterddp {action} openpai", description={
        "render": "Render the job file as an OpenPAI protocol-v2 job.",
        "submit": "Render the job file and submit it to OpenPAI's REST server.",
        "status": "Show an OpenPAI job's state.",
        "stop": "Stop an OpenPAI job.",
    }[action])
    if action in ("render", "submit"):
        parser.add_argument("job", help="job file (jobs/*.yaml), as the task finds it after the setup lines")
        parser.add_argument("--name", help="OpenPAI job name (default: openpai.name, else the job's name)")
    else:
        parser.add_argument("job_id", metavar="USER~JOB", help="the id 'submit' printed")
    if action == "render":
        parser.add_argument("-o", "--output", help="write the spec here instead of printing it")
        return parser
    parser.add_argument("--url", help=f"the OpenPAI web portal, e.g. https://pai.example (or {URL_ENV})")
    parser.add_argument("--token-file", help=f"file holding the bearer token (default: ${TOKEN_ENV})")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the server")
    if action == "submit":
        parser.add_argument("--dry-run", action="store_true", help="print the spec and the request, send nothing")
    if action == "status":
        parser.add_argument("--json", action="store_true", help="print the server's whole answer")
    return parser


def main(action: str, argv: list[str], env: Mapping[str, str] | None = None) -> int:
    """Run one action; errors are raised as ClusterDDPError for the CLI to print as one line."""
    if action not in ACTIONS:
        raise SubmitError(f"openpai supports {', '.join(ACTIONS)}, not {action!r}")
    env = os.environ if env is None else env
    args = build_parser(action).parse_args(argv)
    if action in ("render", "submit"):
        job = load_job(args.job)
        spec = render_openpai(job, args.job, name=args.name)
        if action == "render":
            return _render(spec, args.output)
        if job.env_passthrough:
            print(f"clusterddp: warning: env_passthrough ({', '.join(job.env_passthrough)}) is not sent to OpenPAI: "
                  "the container must provide these variables itself", file=sys.stderr)
        return _submit(spec, args, env)
    client = _client(args, env)
    if action == "status":
        return _status(client, args.job_id, args.json)
    client.stop(args.job_id)
    print(f"clusterddp: asked OpenPAI to stop {args.job_id}", file=sys.stderr)
    return 0


def _render(spec: str, output: str | None) -> int:
    if output is None:
        sys.stdout.write(spec)
        return 0
    write_output(output, spec)
    print(f"wrote {output}; submit it in the web portal, or with 'clusterddp submit openpai'", file=sys.stderr)
    return 0


def _submit(spec: str, args: argparse.Namespace, env: Mapping[str, str]) -> int:
    url = environment_url(args.url, env)
    if args.dry_run:
        endpoint = base_url(url) + "/api/v2/jobs" if url else "<url>/rest-server/api/v2/jobs"
        print(f"# dry run: would POST this to {endpoint} as text/yaml, "
              f"with Authorization: Bearer <token from {'--token-file' if args.token_file else TOKEN_ENV}>")
        sys.stdout.write(scrub(spec))
        return 0
    job_id = _client(args, env).submit(spec)
    print(job_id)
    print(f"clusterddp: submitted; follow it with: clusterddp status openpai {job_id} --url {url}",
          file=sys.stderr)
    return 0


def _client(args: argparse.Namespace, env: Mapping[str, str]) -> OpenPAIClient:
    url = environment_url(args.url, env)
    if url is None:
        raise SubmitError(f"no OpenPAI address: pass --url or set {URL_ENV}")
    client = OpenPAIClient(url, read_token(args.token_file, env), timeout=args.timeout)
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
