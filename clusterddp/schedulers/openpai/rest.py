"""A small client for OpenPAI's REST server (v2 API), on the standard library only.

Endpoints (microsoft/pai rest-server, mounted under ``/rest-server``):
``POST /api/v2/jobs`` (body: the protocol YAML as ``text/yaml``; 202 when accepted),
``GET /api/v2/jobs/<user>~<job>`` and ``PUT /api/v2/jobs/<user>~<job>/executionType``.

The bearer token is a ``Secret``: its repr hides it, it is sent only to the URL given (never
along a redirect) and any server text is scrubbed of it before it reaches an error message.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from clusterddp.errors import ClusterDDPError, SubmitError
from clusterddp.redact import MASK, register, scrub
from clusterddp.validate import MAX_SECRET_CHARS, secret_problem, shown

log = logging.getLogger(__name__)

TOKEN_ENV = "CLUSTERDDP_OPENPAI_TOKEN"
URL_ENV = "CLUSTERDDP_OPENPAI_URL"
JOB_ID = re.compile(r"^[^~/\s]+~[A-Za-z0-9_-]+$")
_ACCEPTED_USER = re.compile(r"for user (\S+?) successfully")
#: The server's own words are shown, but kept to one line of reasonable length.
_MESSAGE_LIMIT = 400


class Secret:
    """A string that never shows itself in a repr, a traceback's locals or an f-string."""

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def read_token(token_file: str | None, env: Mapping[str, str]) -> Secret:
    """The token from ``--token-file`` if given, else ``CLUSTERDDP_OPENPAI_TOKEN``.

    Never from the job file: job files are committed and shared. The token is checked (one line
    of visible ASCII, bounded) before any use, and registered with clusterddp.redact so no
    message can show it; the errors here name where it came from, never what it holds.
    """
    if token_file:
        where = f"{shown(token_file)} (--token-file)"
        try:
            with open(token_file, "rb") as handle:
                raw = handle.read(MAX_SECRET_CHARS + 2)
        except OSError as exc:
            raise SubmitError(f"cannot read the token file {shown(token_file)}: {exc.strerror}") from None
        value = raw.decode("utf-8", "replace").strip()
    else:
        where = TOKEN_ENV
        value = env.get(TOKEN_ENV, "").strip()
        if not value:
            raise SubmitError(f"no OpenPAI token: set {TOKEN_ENV} or pass --token-file FILE",
                              "create an application token in the OpenPAI web portal (your profile page)")
    register(value)
    problem = secret_problem(value)
    if problem:
        raise ClusterDDPError(f"{where}: token: {problem}",
                              "the token is one line; copy it again from the OpenPAI web portal")
    return Secret(value)


def base_url(url: str) -> str:
    """``https://pai.example/`` or ``.../rest-server`` -> ``https://pai.example/rest-server``."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SubmitError(f"not an http(s) URL: {url!r}", "give the web portal's address, e.g. https://pai.example")
    path = parts.path.rstrip("/")
    if not path.endswith("/rest-server"):
        path += "/rest-server"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def check_job_id(job_id: str) -> str:
    if not JOB_ID.fullmatch(job_id):
        raise SubmitError(f"not an OpenPAI job id: {job_id!r}", "job ids look like USER~JOBNAME")
    return job_id


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: the token goes to the URL the user gave and nowhere else."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


@dataclass(frozen=True)
class Response:
    status: int
    body: str

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass(frozen=True)
class OpenPAIClient:
    """Talks to one OpenPAI cluster as one user; every method raises SubmitError on failure."""

    url: str
    token: Secret = field(repr=False)
    timeout: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", base_url(self.url))

    def submit(self, spec_yaml: str) -> str:
        """Submit a protocol-v2 job; the job id ``<user>~<name>`` when the server accepts it."""
        name = _job_name(spec_yaml)
        reply = self._request("POST", "/api/v2/jobs", spec_yaml.encode("utf-8"), "text/yaml", job=name)
        data = reply.json()
        message = str(data.get("message", "")) if isinstance(data, dict) else ""
        user = _user_from_message(message) or _user_from_token(self.token)
        return f"{user}~{name}" if user else name

    def status(self, job_id: str) -> dict[str, Any]:
        """The job's record (``jobStatus.state`` is WAITING, RUNNING, SUCCEEDED, FAILED...)."""
        reply = self._request("GET", f"/api/v2/jobs/{_quote(check_job_id(job_id))}", job=job_id)
        data = reply.json()
        if not isinstance(data, dict):
            raise SubmitError(f"OpenPAI at {self.url} answered the status of {job_id} with something "
                              "other than a JSON object")
        return data

    def jobs_of(self, username: str) -> list[dict[str, Any]]:
        """Every job of ``username``, one summary each (``name``, ``username``, ``state``,
        ``retries``, ``appExitCode``...): ``GET /api/v2/jobs?username=USER``, one call for all."""
        reply = self._request("GET", "/api/v2/jobs?" + urllib.parse.urlencode({"username": username}),
                              job=f"{username}'s jobs")
        data = reply.json()
        if not isinstance(data, list):
            raise SubmitError(f"OpenPAI at {self.url} answered the list of {username}'s jobs with something "
                              "other than a JSON array")
        return [job for job in data if isinstance(job, dict)]

    def stop(self, job_id: str) -> None:
        """Ask OpenPAI to stop the job (it moves to STOPPING, then STOPPED)."""
        body = json.dumps({"value": "STOP"}).encode()
        self._request("PUT", f"/api/v2/jobs/{_quote(check_job_id(job_id))}/executionType", body,
                      "application/json", job=job_id)

    def _request(self, method: str, path: str, body: bytes | None = None,
                 content_type: str | None = None, job: str = "") -> Response:
        endpoint = self.url + path
        request = urllib.request.Request(endpoint, data=body, method=method)
        if content_type:
            request.add_header("Content-Type", content_type)
        request.add_header("Accept", "application/json")
        request.add_unredirected_header("Authorization", f"Bearer {self.token.reveal()}")
        opener = urllib.request.build_opener(_NoRedirect)
        log.debug("%s %s", method, endpoint)
        try:
            with opener.open(request, timeout=self.timeout) as answer:
                reply = Response(answer.status, answer.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            reply = Response(exc.code, _read(exc))
            location = exc.headers.get("Location") if exc.headers else None
            exc.close()
            log.debug("%s %s -> %d", method, endpoint, reply.status)
            raise self._refusal(reply, job, location) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise SubmitError(self._unreachable(exc)) from None
        except ValueError as exc:  # http.client refuses a header value; its message holds it
            raise SubmitError(f"cannot send the request to {self.url}: {self._scrub(str(exc))}") from None
        log.debug("%s %s -> %d", method, endpoint, reply.status)
        return reply

    def _unreachable(self, exc: BaseException) -> str:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return f"no answer from OpenPAI at {self.url} within {self.timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return f"cannot reach OpenPAI at {self.url}: connection refused"
        detail = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        return f"cannot reach OpenPAI at {self.url}: {self._scrub(detail)}"

    def _refusal(self, reply: Response, job: str, location: str | None) -> SubmitError:
        """One line per refusal, with the server's own message (scrubbed of the token)."""
        data = reply.json()
        message = data.get("message") if isinstance(data, dict) else None
        text = self._scrub(_one_line(str(message) if message is not None else reply.body))
        code = data.get("code") if isinstance(data, dict) else None
        said = f"{reply.status} {code}" if code else str(reply.status)
        if reply.status == 400:
            return SubmitError(f"OpenPAI rejected the job ({said}): {text}")
        if reply.status == 401:
            return SubmitError(f"OpenPAI did not accept the token ({said}): {text}",
                               "the token may have expired; create a new one in the web portal")
        if reply.status == 403:
            return SubmitError(f"OpenPAI refused ({said}): {text}",
                               "check that your user may use the job's virtual cluster (openpai.virtual_cluster)")
        if reply.status == 404:
            return SubmitError(f"OpenPAI has no {'job ' + job if job else 'such endpoint'} ({said}): {text}")
        if reply.status == 409:
            return SubmitError(f"OpenPAI already has a job with this name ({said}): {text}",
                               "job names are unique per user: set openpai.name or pass --name")
        if 300 <= reply.status < 400:
            return SubmitError(f"OpenPAI at {self.url} redirects ({reply.status}) to {location or '?'}; "
                               "not following it with the token", "pass the final address as --url")
        return SubmitError(f"OpenPAI answered {said}: {text or '(no message)'}")

    def _scrub(self, text: str) -> str:
        register(self.token.reveal())
        text = text.replace(self.token.reveal(), MASK) if self.token.reveal() else text
        return scrub(text)


def _read(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return ""


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MESSAGE_LIMIT else line[:_MESSAGE_LIMIT] + "..."


def _quote(job_id: str) -> str:
    return urllib.parse.quote(job_id, safe="~")


def _job_name(spec_yaml: str) -> str:
    """The ``name:`` of a rendered spec (read back rather than passed along, so they agree)."""
    try:
        data = yaml.safe_load(spec_yaml)
    except yaml.YAMLError as exc:
        raise SubmitError(f"the OpenPAI job is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise SubmitError("the OpenPAI job has no 'name'")
    return str(data["name"])


def _user_from_message(message: str) -> str | None:
    """The 202 message says ``Update job <name> for user <user> successfully.``"""
    found = _ACCEPTED_USER.search(message)
    return found.group(1) if found else None


def _user_from_token(token: Secret) -> str | None:
    """OpenPAI's tokens are JWTs whose payload names the user; read it, do not verify it."""
    parts = token.reveal().split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    user = payload.get("username") if isinstance(payload, dict) else None
    return user if isinstance(user, str) and user else None


def environment_url(explicit: str | None, env: Mapping[str, str]) -> str | None:
    """``--url`` if given, else ``CLUSTERDDP_OPENPAI_URL``."""
    return explicit or env.get(URL_ENV) or None
