"""``clusterddp run JOB --hostfile F``: the same launcher on every host, supervised from here.

Steps: hosts (hostfile + ssh_config) -> connect and probe every host in parallel ->
preflight (all problems at once, nothing started) -> one ``LaunchPlan`` per host -> GO to
every stub at once -> relay output and heartbeats until the end -> report naming the host
that failed first. docs/ssh.md is the user's guide to all of it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping, Sequence

from clusterddp.errors import RemoteError
from clusterddp.hostfile import HostEntry, entries_from_list, read_hostfile, select_hosts
from clusterddp.launch.run import RunOptions
from clusterddp.launch.ssh.connect import ConnectSettings
from clusterddp.launch.ssh.hosts import Host, load_ssh_config, resolve_hosts
from clusterddp.launch.ssh.preflight import (HeadFacts, HostSession, PreflightError, check_all,
                                             raise_problems, start_sessions)
from clusterddp.launch.ssh.io import RemoteLauncher
from clusterddp.launch.ssh.relay import Relay
from clusterddp.launch.ssh.remote_command import (LaunchPlan, forwarded_env, launcher_argv,
                                                  launcher_env)
from clusterddp.launch.ssh.summary import format_outcome
from clusterddp.protocol import STACKS_REQUEST_SIGNAL, write_launcher_file
from clusterddp.redact import passthrough_env
from clusterddp.spec import JobSpec
from clusterddp.topology import choose_port, count_workers, default_run_id, is_loopback

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FDS_PER_HOST = 5


@dataclass(frozen=True)
class FanoutOptions:
    """What the command line adds to the job file for a fan-out (None: the job decides)."""

    #: Hostfile path; wins over ``ssh.hostfile`` and ``ssh.hosts`` of the job.
    hostfile: str | None = None
    #: Host globs; ``include`` replaces the job's, ``exclude`` adds to the job's.
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: ``--nproc-per-node`` as given (int, 'auto', 'gpu', 'cpu'): wins over hostfile slots.
    nproc_per_node: int | str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    #: Connect and preflight every host, print each host's plan and command, start nothing.
    dry_run: bool = False
    #: Flags every remote launcher gets as well (``--restarts 2``, ``--log-dir D`` ...): the
    #: remote reads the job file itself, so command-line overrides must travel with it.
    launcher_args: tuple[str, ...] = ()
    #: Remote working directory; default: the head's (a shared filesystem is assumed).
    cwd: str | None = None
    #: Head environment the allow-list is taken from; default ``os.environ``.
    head_env: Mapping[str, str] | None = None
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 6.0
    stdout: BinaryIO | None = None
    stderr: BinaryIO | None = None
    #: Run this instead of the job's script (``("-m", "pkg.mod", ...)``): the job still gives
    #: hosts, env, interpreter and workers per host. ``clusterddp doctor`` runs its worker so.
    command: tuple[str, ...] | None = None
    #: Called with every host's session once all probes are in, before the checks: the
    #: doctor prints each host's facts even when some host fails preflight.
    on_probed: Callable[[Sequence[HostSession]], None] | None = None


@dataclass
class _Stop:
    """Signals that arrive before the relay exists are remembered and acted on at once."""

    relay: Relay | None = None
    signum: int | None = None
    previous: dict[int, Any] = field(default_factory=dict)

    def __call__(self, signum: int, frame: object) -> None:
        self.signum = self.signum or signum
        if self.relay is not None:
            self.relay.request_stop(f"{signal.Signals(signum).name} on the head", signum)

    def stacks(self, signum: int, frame: object) -> None:
        """``clusterddp stacks`` asks the head; before the relay runs there is nothing to ask."""
        if self.relay is not None:
            self.relay.request_stacks()


def run_fanout(job: JobSpec, options: FanoutOptions) -> int:
    """Run ``job`` on every host; return the exit code (0, or the first failure's)."""
    out = options.stdout or sys.stdout.buffer
    err = options.stderr or sys.stderr.buffer
    say = _sayer(err)
    entries = _entries(job, options)
    ssh = replace(job.ssh, config_file=_job_path(job, job.ssh.config_file),
                  known_hosts=_job_path(job, job.ssh.known_hosts),
                  identity_file=_job_path(job, job.ssh.identity_file))
    hosts = resolve_hosts(entries, ssh, load_ssh_config(ssh.config_file))
    settings = ConnectSettings(timeout=job.ssh.connect_timeout, accept_new_host_keys=job.ssh.accept_new_host_keys)
    run_id = options.run_id or default_run_id(job.name)  # handed to every host: unique
    master_port = choose_port(run_id, options.master_port, job.master.port)
    master_addr = options.master_addr or job.master.addr or _address_of(hosts[0])
    if len(hosts) > 1 and is_loopback(master_addr):
        raise RemoteError(f"master address {master_addr} is loopback, but the job spans {len(hosts)} hosts",
                          "set master.addr to an address the other hosts can reach")
    python = job.python or sys.executable
    cwd = options.cwd or os.getcwd()
    head_env = dict(os.environ if options.head_env is None else options.head_env)
    base_env = head_launch_env(job, head_env)
    target, paths = _target(job, options)

    _raise_fd_limit(len(hosts), say)
    say(f"{len(hosts)} hosts, run id {run_id}, master {master_addr}:{master_port}; "
        f"host keys: {settings.policy_name}")
    stop = _Stop()
    _install(stop)
    sessions: list[HostSession] = []
    try:
        started = time.monotonic()

        def request(node_rank: int, host: Host) -> dict[str, Any]:
            return {"cwd": cwd, "env": base_env, "master_addr": master_addr, "master_port": master_port,
                    "check_port": node_rank == 0, "paths": paths}

        sessions = start_sessions(hosts, settings, python, request, job.ssh.parallel,
                                  probe_timeout=max(30.0, 3 * settings.timeout))
        if options.on_probed is not None:
            options.on_probed(sessions)
        check_all(sessions, HeadFacts.here())
        plans = _plans(job, options, sessions, target, master_addr or "", master_port, run_id, base_env, cwd)
        say(f"preflight passed on {len(hosts)} hosts in {time.monotonic() - started:.1f}s")
        if options.dry_run:
            out.write(dry_run_text(job, plans, sessions, master_addr or "", master_port, run_id).encode())
            out.flush()
            return 0
        if stop.signum is not None:
            say(f"{signal.Signals(stop.signum).name} during preflight: nothing was started")
            return 128 + stop.signum
        return _run(job, options, sessions, plans, settings, run_id, stop, out, err)
    finally:
        _restore(stop)
        for session in sessions:
            session.close()


def _target(job: JobSpec, options: FanoutOptions) -> tuple[list[str], list[str]]:
    """What every remote launcher runs (the job file, or ``-- argv``), and the paths preflight
    checks on each host (the job file and its script)."""
    if options.command:
        return ["--", *options.command], []
    target = [os.path.abspath(job.source)] if job.source else ["--", *job.entry_argv()]
    paths = [os.path.abspath(job.source)] if job.source else []
    if job.script:
        paths.append(os.path.abspath(job.script_path()))
    return target, paths


def _run(job: JobSpec, options: FanoutOptions, sessions: list[HostSession], plans: list[LaunchPlan],
         settings: ConnectSettings, run_id: str, stop: _Stop, out: BinaryIO, err: BinaryIO) -> int:
    log_dir = Path(job.logs.dir) / run_id
    log_dir.mkdir(parents=True, exist_ok=True)
    launchers = [RemoteLauncher(session=s, plan=p, log=open(log_dir / f"ssh-{s.host.name}.log", "ab"))
                 for s, p in zip(sessions, plans)]
    write_launcher_file(log_dir, socket.gethostname(), run_id, list(range(sum(p.nproc for p in plans))),
                        hosts=[p.host for p in plans])
    relay = Relay(launchers, out, err, settings, grace_period=job.grace_period,
                  heartbeat_interval=options.heartbeat_interval, log_dir=log_dir)
    stop.relay = relay
    if stop.signum is not None:
        relay.request_stop(f"{signal.Signals(stop.signum).name} on the head", stop.signum)
    try:
        outcome = relay.run()
    finally:
        for launcher in launchers:
            launcher.log.close()
    report = format_outcome(job.name, outcome)
    if report:
        err.write((report + f"\n  head's copy of each host's output: {log_dir}/ssh-<host>.log\n").encode())
        err.flush()
    return outcome.exit_code


def head_launch_env(job: JobSpec, head_env: Mapping[str, str]) -> dict[str, str]:
    """What every host's launcher gets from the head: the allow-list, ``ssh.env_allow``, the
    ``env_passthrough`` variables (an unset one is an error before any host is contacted), then
    the job's ``env:``."""
    passthrough_env(job.env_passthrough, head_env, job.source or "<command line>", job.env)
    return {**forwarded_env(head_env, job.ssh.env_allow, job.env_passthrough), **job.env}


def _plans(job: JobSpec, options: FanoutOptions, sessions: Sequence[HostSession], target: list[str],
           master_addr: str, master_port: int, run_id: str, base_env: Mapping[str, str],
           cwd: str) -> list[LaunchPlan]:
    """One plan per host; every host must run the same number of workers (torchrun's formula)."""
    counts: list[tuple[int, str]] = []
    for session in sessions:
        count, why = _nproc(job, options, session)
        counts.append((count, why))
        if job.backend == "nccl" and session.facts["gpus"] < count:
            session.problems.append(f"backend nccl needs a GPU per worker: {count} workers, "
                                    f"{session.facts['gpus']} GPUs visible")
        if count < 1:
            session.problems.append(f"no workers to run ({why})")
    raise_problems(sessions)
    if len({c for c, _ in counts}) > 1:
        detail = ", ".join(f"{s.host.name}: {c} ({why})" for s, (c, why) in zip(sessions, counts))
        raise PreflightError({}, len(sessions), [
            f"workers per host differ ({detail}); global rank = node_rank * nproc_per_node + local_rank "
            "needs the same number on every host (hint: equal slots= in the hostfile, or --nproc-per-node N)"])
    nproc = counts[0][0]
    plans = []
    for session in sessions:
        route = session.facts.get("route") or {}
        interface = job.ssh.interface or route.get("dev")
        argv = launcher_argv(session.facts["executable"], target, nnodes=len(sessions),
                             node_rank=session.node_rank, master_addr=master_addr, master_port=master_port,
                             run_id=run_id, nproc=nproc, heartbeat_timeout=options.heartbeat_timeout,
                             extra=options.launcher_args)
        plans.append(LaunchPlan(host=session.host.name, node_rank=session.node_rank, nproc=nproc, argv=argv,
                                env=launcher_env(base_env, job.env, interface), cwd=cwd,
                                passthrough=tuple(job.env_passthrough)))
    return plans


def _nproc(job: JobSpec, options: FanoutOptions, session: HostSession) -> tuple[int, str]:
    """Workers on one host: --nproc-per-node, else the host's slots, else the job's
    nproc_per_node counted on the host (``topology.count_workers``)."""
    if isinstance(options.nproc_per_node, int):
        return options.nproc_per_node, "--nproc-per-node"
    if options.nproc_per_node is None and session.host.slots:
        return session.host.slots, f"slots={session.host.slots} at {session.host.origin}"
    request = options.nproc_per_node or job.nproc_per_node
    return count_workers(request, session.facts["gpus"], session.facts["cpus"])  # type: ignore[arg-type]


def dry_run_text(job: JobSpec, plans: Sequence[LaunchPlan], sessions: Sequence[HostSession],
                 master_addr: str, master_port: int, run_id: str) -> str:
    """The rank table and, per host, the exact command its launcher would run."""
    nproc = plans[0].nproc
    lines = [f"job '{job.name}': {len(plans)} hosts x {nproc} workers = world size {len(plans) * nproc}, "
             f"master {master_addr}:{master_port}, run id {run_id}",
             f"  {'node':<5} {'host':<16} {'address':<16} {'ranks':<12} {'interface':<10} python"]
    for plan, session in zip(plans, sessions):
        first = plan.node_rank * nproc
        ranks = f"{first}-{first + nproc - 1}" if nproc > 1 else str(first)
        iface = plan.env.get("GLOO_SOCKET_IFNAME", "-")
        lines.append(f"  {plan.node_rank:<5} {plan.host:<16} {session.host.address:<16} {ranks:<12} "
                     f"{iface:<10} {session.facts['python']}")
    lines.append("commands (what each host's stub will exec, as a shell line):")
    for plan in plans:
        lines.append(f"  {plan.host}: {plan.shell_line()}")
    return "\n".join(lines) + "\n"


def fanout_options(options: RunOptions) -> FanoutOptions:
    """FanoutOptions from ``clusterddp run``'s options; launcher flags are passed on to every host."""
    passthrough: list[str] = []
    for flag, value in (("--restarts", options.restarts), ("--grace-period", options.grace_period),
                        ("--python", options.python), ("--log-dir", options.log_dir),
                        ("--cpu-affinity", options.cpu_affinity)):
        if value is not None:
            passthrough += [flag, str(value)]
    if options.log_ranks is not None:
        passthrough += ["--log-ranks", ",".join(str(r) for r in sorted(options.log_ranks))]
    if options.no_prefix:
        passthrough.append("--no-prefix")
    if options.virtual_local_rank:
        passthrough.append("--virtual-local-rank")
    return FanoutOptions(
        hostfile=options.hostfile, include=options.include, exclude=options.exclude,
        nproc_per_node=options.nproc_per_node, master_addr=options.master_addr, master_port=options.master_port,
        run_id=options.run_id, dry_run=options.dry_run, launcher_args=tuple(passthrough))


def _entries(job: JobSpec, options: FanoutOptions) -> list[HostEntry]:
    if options.hostfile:
        entries = read_hostfile(options.hostfile)
    elif job.ssh.hostfile:
        entries = read_hostfile(_job_path(job, job.ssh.hostfile) or job.ssh.hostfile)
    elif job.ssh.hosts:
        entries = entries_from_list(job.ssh.hosts, f"{job.source or 'job'}: ssh.hosts")
    else:
        raise RemoteError("no hosts to fan out to", "give --hostfile, or ssh.hosts / ssh.hostfile in the job file")
    return select_hosts(entries, options.include or job.ssh.include, (*job.ssh.exclude, *options.exclude))


def _job_path(job: JobSpec, path: str | None) -> str | None:
    """Paths in the job file are relative to the job file's directory, like ``script``."""
    if path is None:
        return None
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) or job.source is None else os.path.join(job.base_dir, path)


def _address_of(host: Host) -> str | None:
    """Node 0's address as the other hosts should reach it (None: connect will name the problem)."""
    try:
        return str(socket.getaddrinfo(host.address, host.port, type=socket.SOCK_STREAM)[0][4][0])
    except socket.gaierror:
        return None


def _raise_fd_limit(n_hosts: int, say) -> None:  # type: ignore[no-untyped-def]
    """Each host holds ~4 descriptors (socket, the channel's select pipe, the log copy): lift
    the soft limit towards the hard one so a few hundred hosts do not hit the usual 1024."""
    import resource

    needed = FDS_PER_HOST * n_hosts + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            say(f"warning: {n_hosts} hosts need about {needed} file descriptors, the hard limit is {hard}")


def _sayer(err: BinaryIO):  # type: ignore[no-untyped-def]
    def say(message: str) -> None:
        err.write(f"clusterddp: {message}\n".encode())
        err.flush()
    return say


def _install(stop: _Stop) -> None:
    for signum in STOP_SIGNALS:
        try:
            stop.previous[signum] = signal.signal(signum, stop)
        except ValueError:  # not the main thread: the caller handles signals
            return
    stop.previous[STACKS_REQUEST_SIGNAL] = signal.signal(STACKS_REQUEST_SIGNAL, stop.stacks)


def _restore(stop: _Stop) -> None:
    for signum, handler in stop.previous.items():
        signal.signal(signum, handler)
