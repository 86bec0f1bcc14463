"""A loopback stand-in for OpenPAI's REST server that speaks the documented v2 API.

It validates submitted YAML with the same rules as the real server (server_rules.py) and
answers with the real status codes and bodies: 202 ``Update job <name> for user <user>
successfully.``, 400 InvalidProtocolError, 401 UnauthorizedUserError, 403 ForbiddenUserError
(virtual cluster), 409 ConflictJobError, 404 NoJobError. Every request is recorded.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import parse_qs, unquote, urlsplit

import yaml
from server_rules import server_errors

PREFIX = "/rest-server/api/v2"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: str


@dataclass
class FakeOpenPAI:
    """State of the fake cluster: one user, its token, the virtual clusters it may use."""

    token: str
    user: str = "alice"
    virtual_clusters: tuple[str, ...] = ("default",)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    #: Seconds to stall before answering (to test client timeouts); released on shutdown.
    stall: float = 0.0
    #: Answer every request with this redirect target instead.
    redirect_to: str | None = None
    #: Put the request's Authorization header into error messages (a careless server).
    echo_auth: bool = False
    #: Answer 202 without naming the user (the client then reads it from the token).
    terse: bool = False
    released: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    #: ``GET /api/v2/jobs?...`` answered so far (``clusterddp ls`` asks once per user).
    list_calls: int = 0


#: The framework controller's state behind each REST state (k8s.js ``convertState``, inverted).
SUB_STATES = {"WAITING": "AttemptCreationPending", "RUNNING": "AttemptRunning", "STOPPING": "AttemptDeletionPending",
              "SUCCEEDED": "Completed", "FAILED": "Completed", "STOPPED": "Completed"}


def summary(job_id: str, job: dict[str, Any]) -> dict[str, Any]:
    """One job as the real list answers it (``convertFrameworkSummary``): a job not completed
    has ``completedTime`` 0 (``new Date(null).getTime()``); ``totalGpuNumber`` is an annotation,
    so a string."""
    import hashlib

    status = job["jobStatus"]
    done = status["state"] in ("SUCCEEDED", "FAILED", "STOPPED")
    retries = status.get("retries", 0)
    tasks = [t for role in job["taskRoles"].values() for t in role["taskStatuses"]]
    return {"debugId": hashlib.md5(job_id.encode()).hexdigest(), "name": job["name"], "username": status["username"],
            "state": status["state"], "subState": SUB_STATES.get(status["state"], "AttemptRunning"),
            "executionType": status["executionType"], "retries": retries,
            "retryDetails": {"user": retries, "platform": 0, "resource": 0},
            "retryDelayTime": 10 if status["state"] == "WAITING" and retries else None,
            "createdTime": job["createdTime"], "completedTime": job["createdTime"] + 1000 if done else 0,
            "appExitCode": status["appExitCode"], "virtualCluster": status["virtualCluster"],
            "totalGpuNumber": "0", "totalTaskNumber": len(tasks), "totalTaskRoleNumber": len(job["taskRoles"])}


def _handler(state: FakeOpenPAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def _body(self) -> str:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length).decode("utf-8") if length else ""

        def _send(self, status: int, data: Any = None, headers: dict[str, str] | None = None,
                  compact: bool = False) -> None:
            payload = (json.dumps(data, separators=(",", ":"), ensure_ascii=False) if compact
                       else json.dumps(data or {})).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def _error(self, status: int, code: str, message: str) -> None:
            if state.echo_auth:
                message += f" (you sent {self.headers.get('Authorization')})"
            self._send(status, {"code": code, "message": message})

        def _handle(self, method: str) -> None:
            body = self._body()
            state.requests.append(Recorded(method, self.path, dict(self.headers.items()), body))
            if state.stall:
                state.released.wait(state.stall)
            if state.redirect_to:
                self._send(307, {}, {"Location": state.redirect_to + self.path})
                return
            if self.headers.get("Authorization") != f"Bearer {state.token}":
                self._error(401, "UnauthorizedUserError", "Guest is not allowed to do this operation.")
                return
            if method == "POST" and self.path == f"{PREFIX}/jobs":
                self._submit(body)
            elif method == "GET" and urlsplit(self.path).path == f"{PREFIX}/jobs":
                self._list(parse_qs(urlsplit(self.path).query))
            elif method == "GET" and self.path.startswith(f"{PREFIX}/jobs/"):
                self._status(self.path[len(PREFIX) + 6:])
            elif method == "PUT" and self.path.startswith(f"{PREFIX}/jobs/") and self.path.endswith("/executionType"):
                self._stop(self.path[len(PREFIX) + 6:-len("/executionType")], body)
            else:
                self._error(404, "NotFoundError", f"{method} {self.path} is not an API endpoint.")

        def _submit(self, body: str) -> None:
            if not (self.headers.get("Content-Type") or "").startswith("text/"):
                self._error(400, "InvalidProtocolError", "The request body must be protocol YAML (text/*).")
                return
            errors = server_errors(body)
            if errors:
                self._error(400, "InvalidProtocolError", "; ".join(errors))
                return
            spec = yaml.safe_load(body)
            vc = (spec.get("defaults") or {}).get("virtualCluster", "default")
            if vc not in state.virtual_clusters:
                self._error(403, "ForbiddenUserError", f"User {state.user} is not allowed to do operation in {vc}")
                return
            job_id = f"{state.user}~{spec['name']}"
            if job_id in state.jobs:
                self._error(409, "ConflictJobError", f"Job {job_id} already exists.")
                return
            role, info = next(iter(spec["taskRoles"].items()))
            state.jobs[job_id] = {
                "name": spec["name"], "createdTime": int(time.time() * 1000),
                "jobStatus": {"username": state.user, "state": "RUNNING", "retries": 0, "appExitCode": None,
                              "executionType": "START", "virtualCluster": vc},
                "taskRoles": {role: {"taskStatuses": [
                    {"taskIndex": i, "taskState": "RUNNING", "containerIp": f"10.151.41.{8 + i}",
                     "containerExitCode": None} for i in range(info.get("instances", 1))]}},
            }
            message = "Accepted." if state.terse else f"Update job {spec['name']} for user {state.user} successfully."
            self._send(202, {"status": 202, "message": message})

        def _status(self, job_id: str) -> None:
            job = state.jobs.get(unquote(job_id))
            if job is None:
                self._error(404, "NoJobError", f"Job {unquote(job_id)} is not found.")
                return
            self._send(200, job)

        def _list(self, query: dict[str, list[str]]) -> None:
            """``GET /api/v2/jobs?username=A,B``: the real server's summaries (rest-server
            models/v2/job/k8s.js ``convertFrameworkSummary``: these keys in this order, newest
            first, written by Express's ``res.json``: compact JSON)."""
            users = ",".join(query.get("username", [])).split(",") if "username" in query else None
            state.list_calls += 1
            self._send(200, [summary(job_id, job) for job_id, job in reversed(state.jobs.items())
                             if users is None or job["jobStatus"]["username"] in users], compact=True)

        def _stop(self, job_id: str, body: str) -> None:
            job = state.jobs.get(unquote(job_id))
            if job is None:
                self._error(404, "NoJobError", f"Job {unquote(job_id)} is not found.")
                return
            if json.loads(body or "{}").get("value") != "STOP":
                self._error(400, "InvalidParametersError", "executionType must be START or STOP.")
                return
            job["jobStatus"].update(state="STOPPING", executionType="STOP")
            self._send(202, {"status": 202, "message": f"Execute job {job['name']} successfully."})

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PUT(self) -> None:
            self._handle("PUT")

    return Handler


class _QuietServer(ThreadingHTTPServer):
    """A client that gave up (the timeout test) resets its connection; that is expected."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


@contextmanager
def fake_openpai(state: FakeOpenPAI) -> Iterator[FakeOpenPAI]:
    """Serve ``state`` on 127.0.0.1 (a free port) in a thread; stop and join it afterwards."""
    server = _QuietServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="fake-openpai", daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        state.released.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=600)
