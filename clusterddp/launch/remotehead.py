"""``clusterddp run JOB --hostfile H --detach``: the SSH head on the first host, not here.

A detached run must outlive the machine that typed the command (closed, asleep, killed, cut
off), so its head cannot live there. It goes to the first host of the hostfile (node 0 of a
fixed-size job): a host the run already depends on, so detaching adds no machine that can fail
it. The command connects there over the same SSH (paramiko, host keys checked) the head uses,
starts ``clusterddp run`` there in its own session (``registry.remote.boot``: setsid, stdin
/dev/null, its console appended to ``<run dir>/console.log`` on that host, its registry that
host's own, or ``$CLUSTERDDP_HEAD_HOME`` as this side gives it), and returns once every rank
of the first attempt runs (each host of the head's ``launcher.json`` counts its own,
``registry.remote.count``), or with the head's own refusal and exit code when it ended first. The head there is the ordinary ``HeadLoop``:
fail-fast, restarts, spares, in-place restarts and hang rules are the same.

What a user needs: the head's host reaches every other host by SSH with what it has *there*
(its ``~/.ssh`` keys and ``known_hosts``, a shared home usually, and the job's ``ssh:``
settings, read from the job file on that host). Agent forwarding would die with the typing
machine's link, the moment a detached run must survive; no private key is ever copied.

This machine records the run (``target: ssh``, ``head``: where it lives and how to reach it,
file *names* only) and asks the head's host for everything else, one connection per host:
``ls``/``status`` (``registry.remote.answer``), ``attach``, ``logs`` and ``stop``
(``registry.remote.command``: that command run there against the head's registry, its output
relayed; Ctrl-C or a lost link ends it there too).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import paramiko

from clusterddp.errors import ClusterDDPError, RemoteError
from clusterddp.launch.options import RunOptions
from clusterddp.launch.ssh.attempt import launch_of
from clusterddp.launch.ssh.fanout import fanout_options
from clusterddp.launch.ssh.hosts import Host
from clusterddp.launch.ssh.reach import ConnectError, ConnectSettings, open_client
from clusterddp.registry import store, track
from clusterddp.registry.detach import CONSOLE_FILE, DETACHED_ENV
from clusterddp.registry.remote import HEAD_HOME_ENV
from clusterddp.registry.store import FINAL, RunRecord
from clusterddp.spec import JobSpec
from clusterddp.validate import clip

#: Seconds between two looks at the head's host while waiting for the ranks.
POLL = 0.02
#: The most seconds ``run --detach`` waits for every rank (probe, preflight, workers' start).
START_WAIT = 600.0


def remote_python(python: str, function: str, args: Sequence[str] = ()) -> str:
    """The remote command running ``registry.remote.FUNCTION`` with ``args``, every part quoted."""
    source = f"from clusterddp.registry.remote import {function}; {function}()"
    return " ".join(["exec", shlex.quote(python), "-c", shlex.quote(source), *map(shlex.quote, args)])


@dataclass
class _Lines:
    """A channel read in whole JSON lines, without blocking."""

    channel: paramiko.Channel
    buffer: bytes = b""
    messages: list[dict[str, Any]] = field(default_factory=list)

    def poll(self) -> bool:
        """Read what arrived; False once the channel's command has ended and all is read."""
        while self.channel.recv_ready():
            self.buffer += self.channel.recv(65536)
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                self.messages.append(message)
        return not (self.channel.exit_status_ready() and not self.channel.recv_ready())

    def take(self) -> list[dict[str, Any]]:
        taken, self.messages = self.messages, []
        return taken


def _exec(client: paramiko.SSHClient, command: str) -> paramiko.Channel:
    channel = client.get_transport().open_session()  # type: ignore[union-attr]
    channel.exec_command(command)
    return channel


def _connect(host: Host, settings: ConnectSettings) -> paramiko.SSHClient:
    try:
        return open_client(host, settings)
    except ConnectError as exc:
        raise RemoteError(f"{host.name}: {exc}") from None


def detach(job: JobSpec, options: RunOptions, child_args: Sequence[str]) -> int:
    """Start the run's head on its first host; 0 once every rank runs (or the head's own exit
    code when it ended first). ``child_args``: ``clusterddp run``'s arguments for the head
    (no ``--detach``, the run id fixed)."""
    launch = launch_of(job, fanout_options(options))
    run_id = launch.run_id
    first = launch.hosts[0]
    run_dir = os.path.normpath(os.path.join(launch.cwd, job.logs.dir, run_id))
    console = os.path.join(run_dir, CONSOLE_FILE)
    # What the head would read from this machine's environment: the variables the job forwards
    # (env_passthrough, ssh.env_allow) and the CLUSTERDDP_* flag fallbacks. Sent on stdin,
    # never on a command line; the head masks the passthrough ones as it always does.
    env = {k: os.environ[k] for k in launch.base_env if k in os.environ and k not in job.env}
    env.update({k: v for k, v in os.environ.items()
                if k.startswith("CLUSTERDDP_") and k not in (store.HOME_ENV, HEAD_HOME_ENV)})
    env[DETACHED_ENV] = console
    request = {"argv": [launch.python, "-m", "clusterddp", "run", *child_args], "env": env, "cwd": launch.cwd,
               "console": console, "run_dir": run_dir, "home": os.environ.get(HEAD_HOME_ENV, "")}
    clients: dict[str, paramiko.SSHClient] = {first.name: _connect(first, launch.settings)}
    try:
        boot = _Lines(_exec(clients[first.name], remote_python(launch.python, "boot")))
        boot.channel.sendall(json.dumps(request).encode() + b"\n")
        head, home = _first(boot, first)
        record = track.begin("ssh", run_id, job.name, run_dir, job_file=job.source,
                             hosts=[h.name for h in launch.hosts], where=f"head on {first.name}", launcher=False,
                             console=console, detached=True,
                             head={"host": first.name, "address": first.address, "port": first.port,
                                   "user": first.user, "identity_files": list(first.identity_files),
                                   "known_hosts": list(first.known_hosts), "python": launch.python,
                                   "home": home, "pid": head, "connect_timeout": launch.settings.timeout})
        code = _wait_ranks(boot, launch.hosts, launch.settings, clients, launch.python, run_id)
    finally:
        for client in clients.values():
            client.close()  # the boot and the counters see EOF and exit; the head goes on
    if code is not None:
        sys.stderr.write(_cat(first, launch.settings, console))
        if record is not None:
            store.update(run_id, None, state="finished" if code == 0 else "failed", exit_code=code,
                         ended=store.now())
        return code
    print(run_id)
    print(f"clusterddp: run {run_id} detached: its head runs on {first.name} (pid {head['pid']}), every rank "
          f"running; its console there: {console}\n  clusterddp attach {run_id}    # its console from the first "
          f"line, then follow (Ctrl-C leaves it running)\n  clusterddp ls | status {run_id} | logs {run_id} [-f] "
          f"| stop {run_id}", file=sys.stderr)
    return 0


def _first(boot: _Lines, host: Host) -> tuple[dict[str, Any], str]:
    """The head's identity and its registry there, as ``boot`` reports them first."""
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        alive = boot.poll()
        for message in boot.take():
            if "head" in message and isinstance(message["head"], dict):
                return message["head"], str(message.get("home", ""))
            if "error" in message:
                raise RemoteError(f"{host.name}: {clip(str(message['error']), 300)}")
        if not alive:
            status = boot.channel.recv_exit_status()
            errors = boot.channel.recv_stderr(65536).decode("utf-8", "replace").strip().splitlines()[-1:]
            raise RemoteError(f"{host.name}: the detached head could not be started (exit {status}): "
                              f"{clip(errors[0] if errors else 'no output', 300)}",
                              "clusterddp must be importable on the head's host by the job's python")
        time.sleep(POLL)
    raise RemoteError(f"{host.name}: no answer from the detached head's start within {START_WAIT:.0f}s")


def _wait_ranks(boot: _Lines, hosts: Sequence[Host], settings: ConnectSettings,
                clients: dict[str, paramiko.SSHClient], python: str, run_id: str) -> int | None:
    """None once every rank of the head's first attempt runs on its host; the head's exit code
    when it ended first."""
    by_name = {h.name: h for h in hosts}
    counters: dict[str, _Lines] = {}
    counts: dict[str, int] = {}
    wanted: int | None = None
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        alive = boot.poll()
        for message in boot.take():
            if "ended" in message:
                return int(message["ended"])
            launcher = message.get("launcher")
            if isinstance(launcher, dict) and wanted is None:
                wanted = len(launcher.get("ranks", []))
                for name in launcher.get("hosts", []):
                    if name not in clients:
                        clients[name] = _connect(by_name[name], settings)
                    counters[name] = _Lines(_exec(clients[name], remote_python(python, "count", [run_id])))
        if not alive:
            raise RemoteError(f"{hosts[0].name}: the connection to the detached head's host ended")
        for name, counter in counters.items():
            counter.poll()
            for message in counter.take():
                counts[name] = int(message.get("ranks", 0))
        if wanted is not None and sum(counts.values()) >= wanted:
            return None
        time.sleep(POLL)
    raise RemoteError(f"not every rank ran within {START_WAIT:.0f}s; the run goes on",
                      f"'clusterddp attach {run_id}' shows its console")


def _cat(host: Host, settings: ConnectSettings, path: str) -> str:
    client = _connect(host, settings)
    try:
        channel = _exec(client, f"cat -- {shlex.quote(path)}")
        data = b""
        while True:
            chunk = channel.recv(65536)
            if not chunk:
                break
            data += chunk[: (1 << 16) - len(data)]
        return data.decode("utf-8", "replace")
    finally:
        client.close()


# --- the typing machine's commands on a detached SSH run -----------------------------------

def _head_host(record: RunRecord) -> tuple[Host, ConnectSettings]:
    head = record.head
    host = Host(name=str(head.get("host")), address=str(head.get("address")), port=int(head.get("port", 22)),
                user=str(head.get("user")), identity_files=tuple(head.get("identity_files", [])),
                known_hosts=tuple(head.get("known_hosts", [])), slots=None, origin="the run's record")
    return host, ConnectSettings(timeout=float(head.get("connect_timeout", 10.0)), link_timeout=10.0)


def command(record: RunRecord, argv: Sequence[str]) -> int:
    """``clusterddp ARGV`` run on the head's host against the head's registry, its output
    relayed here; its exit code. Ctrl-C ends it there too."""
    host, settings = _head_host(record)
    client = _connect(host, settings)
    try:
        channel = _exec(client, remote_python(str(record.head.get("python")), "command",
                                              [str(record.head.get("home")), *argv]))
        out, err = sys.stdout.buffer, sys.stderr.buffer
        while not (channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready()):
            moved = False
            while channel.recv_ready():
                out.write(channel.recv(65536))
                moved = True
            while channel.recv_stderr_ready():
                err.write(channel.recv_stderr(65536))
                moved = True
            out.flush()
            err.flush()
            if not moved:
                time.sleep(POLL)
        return channel.recv_exit_status()
    finally:
        client.close()


def attach(record: RunRecord) -> int:
    """``clusterddp attach RUN`` of a detached SSH run: its console on the head's host."""
    try:
        return command(record, ["attach", record.run_id])
    except KeyboardInterrupt:
        print(f"\nclusterddp: detached from run {record.run_id}; it goes on ('clusterddp attach {record.run_id}' "
              "to follow it again)", file=sys.stderr)
        return 0


def stop(record: RunRecord) -> int:
    """``clusterddp stop RUN``: the head stops every rank on every host, as on Ctrl-C."""
    if record.state in FINAL:
        print(f"clusterddp: run {record.run_id} has already ended ({record.state}"
              + (f", exit code {record.exit_code}" if record.exit_code is not None else "") + "): nothing to stop")
        return 0
    store.update(record.run_id, None, stop_requested=store.now())
    code = command(record, ["stop", record.run_id])
    refresh([record])
    return code


def refresh(records: Sequence[RunRecord]) -> dict[str, dict[str, Any]]:
    """What each run's head host says now, one connection per host for all its runs; a final
    state is written into this machine's record, so it is never asked again."""
    groups: dict[tuple[str, int, str], list[RunRecord]] = {}
    for record in records:
        if record.head:
            groups.setdefault((str(record.head.get("address")), int(record.head.get("port", 22)),
                               str(record.head.get("user"))), []).append(record)
    changes: dict[str, dict[str, Any]] = {}
    for group in groups.values():
        try:
            changes.update(_ask(group))
        except (ClusterDDPError, paramiko.SSHException, OSError, EOFError) as exc:
            why = exc.message if isinstance(exc, ClusterDDPError) else str(exc) or type(exc).__name__
            changes.update({r.run_id: {"note": f"not checked: {clip(why, 200)}"} for r in group})
    for run_id, change in changes.items():
        if change.get("state") in FINAL:
            store.update(run_id, None, **{k: v for k, v in change.items() if k != "note"})
    return changes


def _ask(group: Sequence[RunRecord]) -> dict[str, dict[str, Any]]:
    host, settings = _head_host(group[0])
    client = _connect(host, settings)
    try:
        channel = _exec(client, remote_python(str(group[0].head.get("python")), "answer"))
        channel.sendall(json.dumps([[r.head.get("home"), r.run_id] for r in group]).encode() + b"\n")
        lines = _Lines(channel)
        while lines.poll():
            time.sleep(POLL)
        lines.poll()
    finally:
        client.close()
    changes: dict[str, dict[str, Any]] = {}
    known = {r.run_id for r in group}
    for message in lines.take():
        run_id = message.pop("run_id", None)
        if run_id not in known:
            continue
        if "error" in message:
            changes[run_id] = {"note": f"its head's host says: {clip(str(message['error']), 200)}"}
            continue
        changes[run_id] = {k: message[k] for k in ("state", "note", "attempts", "exit_code", "root_cause",
                                                     "goodput", "ended") if k in message}
    return changes
