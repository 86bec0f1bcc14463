"""The hosts of a fan-out: where each one really is, and which ones an attempt runs on.

Where: hostfile entries combined with the job's ``ssh:`` and ssh_config.

Precedence for each setting, like OpenSSH's command line over its config file: the hostfile
entry (``user@host``), then the job's ``ssh:`` section, then the ssh_config file, then the
defaults (the alias itself, port 22, the head's user, ~/.ssh keys and the agent).

Which: with ``nodes: "MIN:MAX"`` the hostfile may list spares. Before every attempt each
candidate is probed; hosts that are unreachable or fail preflight are left out, and so is a
host whose connection was lost in the last attempt (a dead node: probing it again would only
wait out the connect timeout). A host whose launcher died while its sshd still answers is
tried again: the node is fine. The first MAX healthy hosts in hostfile order run the attempt;
fewer than MIN ends the job, naming every host left out and why (``choose_hosts``, ``too_few``).
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Generic, Sequence, TypeVar

import paramiko

from clusterddp.errors import RemoteError
from clusterddp.hostfile import HostEntry, Pattern, entries_from_list, read_hostfile, select_hosts
from clusterddp.sections.ssh import SSHSpec
from clusterddp.spec import JobSpec
from clusterddp.validate import shown

DEFAULT_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")
#: ssh_config options that would change how we connect and that paramiko cannot honour here.
UNSUPPORTED = ("proxycommand", "proxyjump")
#: A ``Match`` line as paramiko reads it (``Match`` or ``Match=``, any case); group 1: criteria.
_MATCH = re.compile(r"\s*match(?:\s*=\s*|\s+)(.*?)\s*", re.IGNORECASE)

S = TypeVar("S")


@dataclass(frozen=True)
class Host:
    """One host, ready to connect to."""

    #: As written in the hostfile (an ssh_config alias or an address); used in every message.
    name: str
    address: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    #: First file is where accepted new keys are written (accept_new_host_keys).
    known_hosts: tuple[str, ...]
    slots: int | None
    origin: str

    @property
    def target(self) -> str:
        """``user@address:port`` for messages."""
        return f"{self.user}@{self.address}:{self.port}"


def job_hosts(job: JobSpec, hostfile: str | None, include: Sequence[str], exclude: Sequence[str],
              dry_run: bool = False) -> list[Host]:
    """Every candidate host of a fan-out, settled: the entries (``hostfile``, else the job's
    ``ssh.hostfile`` or ``ssh.hosts``), chosen by the globs (``include`` replaces the job's,
    ``exclude`` adds to them), each resolved through the job's ``ssh:`` and its ssh_config.
    The one place where the job's ``ssh:`` paths are read relative to the job file."""
    entries = _entries(job, hostfile, include, exclude)
    ssh = replace(job.ssh, config_file=job_path(job, job.ssh.config_file),
                  known_hosts=job_path(job, job.ssh.known_hosts), identity_file=job_path(job, job.ssh.identity_file))
    return resolve_hosts(entries, ssh, load_ssh_config(ssh.config_file, dry_run=dry_run))


def _entries(job: JobSpec, hostfile: str | None, include: Sequence[str], exclude: Sequence[str]) -> list[HostEntry]:
    path = hostfile or (job_path(job, job.ssh.hostfile) if job.ssh.hostfile else None)
    if path:
        entries = read_hostfile(path)
    elif job.ssh.hosts:
        places = [job.where(f"ssh.hosts[{i}]") for i in range(len(job.ssh.hosts))]
        entries = entries_from_list(job.ssh.hosts, f"{job.source or 'job'}: ssh.hosts", places)
    else:
        raise RemoteError("no hosts to fan out to", "give --hostfile, or ssh.hosts / ssh.hostfile in the job file")
    # Patterns from the job file carry their file:line: key; the flags' are named as flags.
    chosen: Sequence[Pattern] = include or [(p, job.where(f"ssh.include[{i}]")) for i, p in enumerate(job.ssh.include)]
    left = [(p, job.where(f"ssh.exclude[{i}]")) for i, p in enumerate(job.ssh.exclude)]
    return select_hosts(entries, chosen, [*left, *exclude])


def job_path(job: JobSpec, path: str | None) -> str | None:
    """Paths in the job file are relative to the job file's directory, like ``script``."""
    if path is None:
        return None
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) or job.source is None else os.path.join(job.base_dir, path)


def load_ssh_config(path: str | None, dry_run: bool = False) -> paramiko.SSHConfig:
    """The ssh_config to honour: ``path`` (must exist), else ~/.ssh/config when present.

    ``dry_run``: a ``Match exec`` block is refused. Looking a host up runs its command on this
    machine (paramiko, like OpenSSH, runs it to decide whether the block applies), and a dry
    run runs nothing of the user's. Skipping it instead would print a plan the real run
    might not follow."""
    chosen = os.path.expanduser(path or DEFAULT_CONFIG)
    if not os.path.exists(chosen):
        if path:
            raise RemoteError(f"ssh config file {path} not found", "fix ssh.config_file in the job file")
        return paramiko.SSHConfig()
    try:
        if dry_run:
            _refuse_match_exec(chosen)
        return paramiko.SSHConfig.from_path(chosen)
    except (OSError, UnicodeDecodeError, paramiko.ConfigParseError) as exc:
        raise RemoteError(f"cannot read ssh config {chosen}: {exc}") from None


def _refuse_match_exec(path: str) -> None:
    """Raise naming ``path:line`` of the first ``Match ... exec CMD`` (paramiko's reading of
    the keyword list: each criterion takes one argument, except all, canonical and final)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for number, raw in enumerate(lines, start=1):
        found = _MATCH.fullmatch(raw)
        if not found:
            continue
        try:
            words = shlex.split(found.group(1))
        except ValueError:
            continue  # paramiko refuses the line itself when it parses the file
        while words:
            keyword = words.pop(0).lstrip("!").lower()
            if keyword == "exec":
                command = shown(words[0] if words else "", 80)
                raise RemoteError(f"{path}:{number}: Match exec {command} would run on this machine to "
                                  "resolve the hosts, and a dry run runs nothing of yours",
                                  "run without --dry-run, or give the dry run an ssh.config_file without Match exec")
            if keyword not in ("all", "canonical", "final") and words:
                words.pop(0)


def resolve_hosts(entries: Sequence[HostEntry], spec: SSHSpec, config: paramiko.SSHConfig) -> list[Host]:
    """Hosts with address, port, user, keys and known_hosts files settled."""
    hosts = []
    for entry in entries:
        options = config.lookup(entry.host)
        for name in UNSUPPORTED:
            if name in options:
                raise RemoteError(f"{entry.origin}: {entry.host}: ssh_config {name} is not supported by "
                                  "the SSH fan-out", "make the hosts directly reachable from the head")
        identity = (spec.identity_file,) if spec.identity_file else tuple(options.get("identityfile", ()))
        known: tuple[str, ...]
        if spec.known_hosts:
            known = (spec.known_hosts,)
        elif "userknownhostsfile" in options:
            known = tuple(options["userknownhostsfile"].split())
        else:
            known = DEFAULT_KNOWN_HOSTS
        hosts.append(Host(
            name=entry.host,
            address=options.get("hostname", entry.host),
            port=spec.port or int(options.get("port", 22)),
            user=entry.user or spec.user or options.get("user") or getpass.getuser(),
            identity_files=tuple(os.path.expanduser(p) for p in identity),
            known_hosts=tuple(os.path.expanduser(p) for p in known),
            slots=entry.slots,
            origin=entry.origin,
        ))
    return hosts


@dataclass
class Selection(Generic[S]):
    """The hosts an attempt runs on, and every candidate left out with the reason."""

    chosen: list[S] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)


def choose_hosts(candidates: Sequence[tuple[str, S, Sequence[str]]], high: int) -> Selection[S]:
    """The first ``high`` healthy candidates in order; ``candidates`` are (name, session,
    problems). The others are left out with their problems (or as spares)."""
    selection: Selection[S] = Selection()
    for name, session, problems in candidates:
        if problems:
            selection.left_out.append((name, "; ".join(problems)))
        elif len(selection.chosen) < high:
            selection.chosen.append(session)
        else:
            selection.left_out.append((name, f"spare (nodes: at most {high})"))
    return selection


def too_few(ready: int, low: int, high: int) -> str | None:
    """Why an attempt cannot start with ``ready`` hosts (None: it can)."""
    if ready >= low:
        return None
    need = f"{low}" if low == high else f"at least {low} (nodes: {low}:{high})"
    return f"{ready} host(s) ready, the job needs {need}"
