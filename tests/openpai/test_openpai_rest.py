"""submit/status/stop against a loopback server speaking OpenPAI's v2 API; the token never leaks."""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from pai_server import PREFIX, FakeOpenPAI, fake_openpai

from clusterddp.cli import scheduler_options
from clusterddp.errors import SubmitError
from clusterddp.schedulers.openpai.scheduler import OpenPAIScheduler
from clusterddp.schedulers.openpai.render import render_openpai
from clusterddp.schedulers.openpai.rest import OpenPAIClient, Secret, base_url, read_token
from clusterddp.sections.container import ContainerSpec
from clusterddp.sections.openpai import OpenPAISpec
from clusterddp.spec import load_job

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
JOB = str(HERE / "jobs" / "minimal.yaml")
TOKEN = "tok-3xQ9-very-secret-value"


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib would send loopback traffic to a configured proxy: these tests talk to 127.0.0.1 only."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def pai() -> Iterator[FakeOpenPAI]:
    with fake_openpai(FakeOpenPAI(token=TOKEN)) as state:
        yield state


@pytest.fixture
def leak_check(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """After the test: the token is in no captured output and no log record, at DEBUG level."""
    caplog.set_level(logging.DEBUG)
    yield
    out, err = capsys.readouterr()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert TOKEN not in out + err + logged


def run_openpai(action: str, argv: list[str], env: dict[str, str]) -> int:
    return OpenPAIScheduler().main(scheduler_options(action, "openpai", argv), env=env)


def env(**extra: str) -> dict[str, str]:
    return {"CLUSTERDDP_OPENPAI_TOKEN": TOKEN, **extra}


def submit(pai: FakeOpenPAI, *args: str) -> int:
    return run_openpai("submit", [JOB, "--url", pai.url, *args], env=env())


def test_202_prints_the_job_id_and_sends_yaml_with_bearer_token(
        pai: FakeOpenPAI, capsys: pytest.CaptureFixture[str], leak_check: None) -> None:
    """Accepted: stdout is exactly USER~NAME; the POST carried text/yaml, the bearer token, the spec."""
    assert submit(pai) == 0
    assert capsys.readouterr().out == "alice~minimal\n"
    request, = pai.requests
    assert (request.method, request.path) == ("POST", f"{PREFIX}/jobs")
    assert request.headers["Content-Type"] == "text/yaml"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.body == render_openpai(load_job(JOB), JOB)


def test_url_with_rest_server_suffix_or_slash_reaches_the_same_endpoint(pai: FakeOpenPAI, leak_check: None) -> None:
    """--url given as the portal, with '/', or with '/rest-server' posts to the same place."""
    for i, url in enumerate([pai.url + "/", pai.url + "/rest-server", pai.url + "/rest-server/"]):
        assert run_openpai("submit", [JOB, "--url", url, "--name", f"n{i}"], env=env()) == 0
    assert [r.path for r in pai.requests] == [f"{PREFIX}/jobs"] * 3


def test_400_shows_the_servers_message_on_one_line(pai: FakeOpenPAI, leak_check: None) -> None:
    """A spec the server rejects gives one line with its InvalidProtocolError message."""
    spec = render_openpai(load_job(JOB), JOB).replace("name: minimal", "name: bad.name")
    with pytest.raises(SubmitError) as info:
        OpenPAIClient(pai.url, Secret(TOKEN)).submit(spec)
    text = str(info.value)
    assert text.startswith("OpenPAI rejected the job (400 InvalidProtocolError): name: ")
    assert "does not match" in text and "\n" not in text


def test_403_names_the_virtual_cluster(pai: FakeOpenPAI, tmp_path: Path, leak_check: None) -> None:
    """A virtual cluster the user may not use: 403 with the server's words and a hint."""
    job = tmp_path / "vc.yaml"
    job.write_text((Path(JOB).read_text() + "openpai:\n  virtual_cluster: vip\n")
                   .replace("../../../jobs/hello.py", str(REPO / "jobs" / "hello.py")))
    with pytest.raises(SubmitError, match=r"OpenPAI refused \(403 ForbiddenUserError\): .*not allowed.* vip") as info:
        run_openpai("submit", [str(job), "--url", pai.url], env=env())
    assert "virtual_cluster" in str(info.value)


def test_409_when_the_name_exists(pai: FakeOpenPAI, leak_check: None) -> None:
    """Submitting the same name twice: 409 'Job alice~minimal already exists.' and how to rename."""
    assert submit(pai) == 0
    with pytest.raises(SubmitError, match=r"\(409 ConflictJobError\): Job alice~minimal already exists\..*--name"):
        submit(pai)


def test_401_with_a_wrong_token_never_shows_either_token(
        pai: FakeOpenPAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A wrong token gets a 401 line; neither token appears, even when the server echoes the header."""
    pai.echo_auth = True
    wrong = tmp_path / "token"
    wrong.write_text("wrong-token-abc\n")
    with pytest.raises(SubmitError) as info:
        run_openpai("submit", [JOB, "--url", pai.url, "--token-file", str(wrong)], env=env())
    assert "did not accept the token (401" in str(info.value)
    assert "wrong-token-abc" not in str(info.value) + repr(info.value) and "***" in str(info.value)
    assert pai.requests[0].headers["Authorization"] == "Bearer wrong-token-abc"  # the file wins over the env


def test_echoed_token_is_scrubbed_from_errors(pai: FakeOpenPAI, leak_check: None) -> None:
    """A server that puts the Authorization header in its error text: the token becomes ***."""
    pai.echo_auth = True
    assert submit(pai) == 0
    with pytest.raises(SubmitError) as info:
        submit(pai)
    assert TOKEN not in str(info.value) and "Bearer ***" in str(info.value)


def test_refused_connection_is_one_line(leak_check: None) -> None:
    """Nothing listens on the port: 'connection refused', naming the URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SubmitError, match=rf"cannot reach OpenPAI at http://127.0.0.1:{port}/rest-server: connection refused"):
        run_openpai("submit", [JOB, "--url", f"http://127.0.0.1:{port}"], env=env())


def test_timeout_is_one_line(pai: FakeOpenPAI, leak_check: None) -> None:
    """A server that does not answer in --timeout seconds: 'no answer ... within 0.3 s'."""
    pai.stall = 30
    with pytest.raises(SubmitError, match=r"no answer from OpenPAI at .* within 0.3 s"):
        submit(pai, "--timeout", "0.3")


def test_redirect_is_not_followed_with_the_token(pai: FakeOpenPAI, leak_check: None) -> None:
    """A 307 elsewhere is reported, and the other server never sees the token."""
    with fake_openpai(FakeOpenPAI(token="other")) as elsewhere:
        pai.redirect_to = elsewhere.url
        with pytest.raises(SubmitError, match=rf"redirects \(307\) to {elsewhere.url}"):
            submit(pai)
        assert elsewhere.requests == []


def test_status_and_stop(pai: FakeOpenPAI, capsys: pytest.CaptureFixture[str], leak_check: None) -> None:
    """status prints the state and one line per task; stop PUTs executionType STOP; status follows."""
    assert submit(pai) == 0
    capsys.readouterr()
    args = ["alice~minimal", "--url", pai.url]
    assert run_openpai("status", args, env=env()) == 0
    assert capsys.readouterr().out.splitlines() == [
        "alice~minimal RUNNING", "  worker[0] RUNNING 10.151.41.8", "  worker[1] RUNNING 10.151.41.9"]
    assert run_openpai("stop", args, env=env()) == 0
    stop = pai.requests[-1]
    assert (stop.method, stop.path) == ("PUT", f"{PREFIX}/jobs/alice~minimal/executionType")
    assert json.loads(stop.body) == {"value": "STOP"} and stop.headers["Content-Type"] == "application/json"
    assert run_openpai("status", [*args, "--json"], env=env()) == 0
    assert json.loads(capsys.readouterr().out)["jobStatus"]["state"] == "STOPPING"


def test_status_of_an_unknown_job_is_404(pai: FakeOpenPAI, leak_check: None) -> None:
    """An unknown job id: one line naming it and the server's NoJobError message."""
    with pytest.raises(SubmitError, match=r"no job alice~nope \(404 NoJobError\): Job alice~nope is not found\."):
        run_openpai("status", ["alice~nope", "--url", pai.url], env=env())


def test_user_comes_from_the_token_when_the_server_does_not_say(pai: FakeOpenPAI, capsys: pytest.CaptureFixture[str]) -> None:
    """OpenPAI tokens are JWTs: with a terse 202 the job id's user is read from the token payload."""
    payload = base64.urlsafe_b64encode(json.dumps({"username": "bob"}).encode()).decode().rstrip("=")
    jwt = f"eyJhbGciOiJIUzI1NiJ9.{payload}.c2ln"
    pai.token, pai.terse = jwt, True
    assert run_openpai("submit", [JOB, "--url", pai.url], env={"CLUSTERDDP_OPENPAI_TOKEN": jwt}) == 0
    assert capsys.readouterr().out == "bob~minimal\n"


@pytest.mark.parametrize("argv, env_vars, message", [
    (["alice~j", "--url", "http://127.0.0.1:9"], {}, "no OpenPAI token: set CLUSTERDDP_OPENPAI_TOKEN"),
    (["alice~j"], env(), "no OpenPAI address: pass --url or set CLUSTERDDP_OPENPAI_URL"),
    (["alice~j", "--url", "ftp://x"], env(), "not an http"),
    (["alice/j", "--url", "http://127.0.0.1:9"], env(), "not an OpenPAI job id"),
    (["alice~j", "--url", "http://127.0.0.1:9", "--token-file", "/nonexistent/t"], env(), "cannot read the token file"),
])
def test_configuration_errors_before_any_request(argv: list[str], env_vars: dict[str, str], message: str) -> None:
    """A missing token or URL, a bad URL, job id or token file: a clear error, nothing sent."""
    with pytest.raises(SubmitError, match=message):
        run_openpai("status", argv, env=env_vars)


@pytest.mark.parametrize("given, expected", [
    ("https://pai.example", "https://pai.example/rest-server"),
    ("https://pai.example/", "https://pai.example/rest-server"),
    ("https://pai.example/rest-server/", "https://pai.example/rest-server"),
    ("http://10.0.0.1:9186/sub/path", "http://10.0.0.1:9186/sub/path/rest-server"),
])
def test_base_url(given: str, expected: str) -> None:
    """The portal address becomes the REST server's base, whatever the trailing parts."""
    assert base_url(given) == expected


def test_token_is_hidden_in_reprs(tmp_path: Path) -> None:
    """Secret, the client and its repr/str never show the token; the env is read only when asked."""
    client = OpenPAIClient("https://pai.example", read_token(None, env()))
    assert TOKEN not in repr(client) + str(client.token) + repr(client.token) + f"{client.token}"
    assert client.token.reveal() == TOKEN


def test_cli_subprocess_submit_and_conflict_never_print_the_token(pai: FakeOpenPAI) -> None:
    """The real command: exit 0 and the id on stdout, then exit 1 with one line on a 409; no token."""
    command = [sys.executable, "-m", "clusterddp", "submit", "openpai", JOB, "--url", pai.url]
    run_env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()}, **env()}
    first = subprocess.run(command, capture_output=True, text=True, env=run_env, cwd=REPO, timeout=600)
    second = subprocess.run(command, capture_output=True, text=True, env=run_env, cwd=REPO, timeout=600)
    assert (first.returncode, first.stdout) == (0, "alice~minimal\n"), first.stderr
    assert second.returncode == 1 and second.stdout == ""
    assert second.stderr.strip().startswith("clusterddp: error: OpenPAI already has a job with this name (409")
    assert len(second.stderr.strip().splitlines()) == 1
    assert TOKEN not in first.stdout + first.stderr + second.stdout + second.stderr


def test_rendered_spec_submits_unchanged_for_a_gpu_job(pai: FakeOpenPAI, leak_check: None) -> None:
    """A GPU job's spec (gpu 4, nccl) passes the server's rules and is accepted."""
    job = replace(load_job(JOB), backend="nccl", nproc_per_node=4,
                  container=ContainerSpec(image="img"),
                  openpai=replace(OpenPAISpec(), gpu=4, virtual_cluster="default"))
    spec = render_openpai(job, "jobs/x.yaml", name="gpu-job")
    assert OpenPAIClient(pai.url, Secret(TOKEN)).submit(spec) == "alice~gpu-job"
    assert yaml.safe_load(pai.requests[0].body)["taskRoles"]["worker"]["resourcePerInstance"]["gpu"] == 4
