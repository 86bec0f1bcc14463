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
from clusterddp.launch.ssh.attempts import (Attempt, choose_hosts, next_backoff, restart_line, start_line,
                                            too_few)
from clusterddp.launch.ssh.preflight import (HeadFacts, HostSession, PreflightError, check_hosts,
                                             raise_problems, start_sessions)
from clusterddp.launch.ssh.io import RemoteLauncher
from clusterddp.launch.ssh.relay import Outcome, Relay
from clusterddp.launch.ssh.remote_command import (LaunchPlan, forwarded_env, launcher_argv,
                                                  launcher_env)
from clusterddp.launch.ssh.summary import format_outcome, launcher_end
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


@dataclass(frozen=True)
class _Launch:
    """What every attempt of one fan-out shares: the hosts to choose from and how to start them."""

    job: JobSpec
    options: FanoutOptions
    #: Every candidate host, in hostfile order.
    hosts: list[Host]
    settings: ConnectSettings
    run_id: str
    #: The user's master address (flag or job file); None: node 0's address, per attempt.
    master_addr: str | None
    python: str
    cwd: str
    base_env: dict[str, str]
    target: list[str]
    paths: list[str]
    #: ``nodes`` as (MIN, MAX): every listed host for a fixed count, the job's range for "MIN:MAX".
    low: int
    high: int
    out: BinaryIO
    err: BinaryIO


@dataclass
class _Start:
    """One attempt's hosts (probed, chosen, node ranks given) and their launchers' plans."""

    sessions: list[HostSession]
    plans: list[LaunchPlan]
    master_addr: str
    master_port: int


def run_fanout(job: JobSpec, options: FanoutOptions) -> int:
    """Run ``job`` on every host (restarting the whole job up to ``restarts`` times); return the
    exit code (0, or the first failure's of the last attempt)."""
    out = options.stdout or sys.stdout.buffer
    err = options.stderr or sys.stderr.buffer
    say = _sayer(err)
    entries = _entries(job, options)
    ssh = replace(job.ssh, config_file=_job_path(job, job.ssh.config_file),
                  known_hosts=_job_path(job, job.ssh.known_hosts),
                  identity_file=_job_path(job, job.ssh.identity_file))
    hosts = resolve_hosts(entries, ssh, load_ssh_config(ssh.config_file))
    low, high = _node_bounds(job, hosts)
    settings = ConnectSettings(timeout=job.ssh.connect_timeout, accept_new_host_keys=job.ssh.accept_new_host_keys)
    run_id = options.run_id or default_run_id(job.name)  # handed to every host: unique
    master_addr = options.master_addr or job.master.addr
    if min(high, len(hosts)) > 1 and is_loopback(master_addr):
        raise RemoteError(f"master address {master_addr} is loopback, but the job spans {min(high, len(hosts))} hosts",
                          "set master.addr to an address the other hosts can reach")
    head_env = dict(os.environ if options.head_env is None else options.head_env)
    target, paths = _target(job, options)
    launch = _Launch(job=job, options=options, hosts=hosts, settings=settings, run_id=run_id,
                     master_addr=master_addr, python=job.python or sys.executable, cwd=options.cwd or os.getcwd(),
                     base_env=head_launch_env(job, head_env), target=target, paths=paths, low=low, high=high,
                     out=out, err=err)
    _raise_fd_limit(len(hosts), say)
    nodes = f", nodes {low}:{high} of {len(hosts)} listed" if job.elastic else ""
    say(f"{len(hosts)} hosts{nodes}, run id {run_id}; host keys: {settings.policy_name}")
    stop = _Stop()
    _install(stop)
    try:
        return _attempts(launch, stop, say)
    finally:
        _restore(stop)


def _node_bounds(job: JobSpec, hosts: Sequence[Host]) -> tuple[int, int]:
    """(MIN, MAX) hosts per attempt: the job's ``nodes: "MIN:MAX"``, else every listed host."""
    if not job.elastic:
        return len(hosts), len(hosts)
    low, high = job.node_range
    if len(hosts) < low:
        raise RemoteError(f"{job.where('nodes')}: {job.nodes!r} needs at least {low} hosts, "
                          f"{len(hosts)} listed", "list more hosts (spares welcome), or lower MIN")
    return low, high


def _attempts(launch: _Launch, stop: _Stop, say: Callable[[str], None]) -> int:
    """Start the job, and start it again after a failure while restarts are left."""
    attempts: list[Attempt] = []
    dead: dict[str, str] = {}  # hosts whose connection was lost in the last attempt
    while True:
        number = len(attempts)
        start: _Start | None = None
        try:
            try:
                start = _prepare(launch, number, dead, say)
            except PreflightError as exc:
                if not attempts:
                    raise
                say(f"restart {number}: {exc}")
                for detail in exc.details:
                    say(f"  {detail}")
                return _finish(attempts, say)
            if launch.options.dry_run:
                launch.out.write(dry_run_text(launch.job, start.plans, start.sessions, start.master_addr,
                                              start.master_port, launch.run_id).encode())
                launch.out.flush()
                return 0
            if stop.signum is not None:
                say(f"{signal.Signals(stop.signum).name} during preflight: nothing was started")
                return 128 + stop.signum if not attempts else _finish(attempts, say)
            began = time.monotonic()
            outcome = _run(launch, start, number, stop)
        finally:
            for session in start.sessions if start else ():
                session.close()
        attempts.append(Attempt(number=number, hosts=tuple(p.host for p in start.plans),
                                world_size=sum(p.nproc for p in start.plans), exit_code=outcome.exit_code,
                                failure=_failure(outcome), seconds=time.monotonic() - began))
        backoff = next_backoff(attempts, launch.job.restarts, stopping=stop.signum is not None)
        if backoff is None:
            return _finish(attempts, say)
        dead = {lau.name: f"connection lost in attempt {number + 1}" for lau in outcome.launchers
                if lau.lost} if launch.job.elastic else {}
        say(restart_line(attempts[-1], launch.job.restarts, backoff, dead))
        # The backoff counts from the failure: stopping the other hosts was part of it.
        stopping = time.monotonic() - outcome.stop_began if outcome.stop_began is not None else 0.0
        if _pause(backoff - stopping, stop):
            say(f"{signal.Signals(stop.signum or signal.SIGTERM).name} before the restart: not restarting")
            return _finish(attempts, say)


def _prepare(launch: _Launch, number: int, dead: dict[str, str], say: Callable[[str], None]) -> _Start:
    """Probe the candidates, choose this attempt's hosts, and plan each one's launcher.

    Node 0's address is the master unless the user gave one; when the first candidate is
    left out, the chosen hosts are probed once more against the new master (its route and
    port are part of the probe)."""
    candidates = [h for h in launch.hosts if h.name not in dead]
    started = time.monotonic()
    for _ in range(2):
        master_addr = launch.master_addr or _address_of(candidates[0]) if candidates else launch.master_addr
        port = _port(launch, number)
        sessions = _probe(launch, candidates, master_addr or "", port)
        selection = choose_hosts([(s.host.name, s, s.problems) for s in sessions], launch.high)
        chosen: list[HostSession] = selection.chosen
        if not launch.job.elastic:
            raise_problems(sessions)  # a fixed node count: every host or none
        problem = too_few(len(chosen), launch.low, launch.high)
        if problem is not None:
            for session in sessions:
                session.close()
            problems = {**{name: [why] for name, why in dead.items()},
                        **{s.label: s.problems for s in sessions if s.problems}}
            raise PreflightError(problems, len(launch.hosts), [problem])
        if launch.master_addr or not chosen or chosen[0] is sessions[0]:
            break
        for session in sessions:  # node 0 changed: probe the chosen hosts against it
            session.close()
        candidates = [s.host for s in chosen]
    for session in sessions:
        if session not in chosen:
            session.close()
    for node_rank, session in enumerate(chosen):
        session.node_rank = node_rank
    plans = _plans(launch, chosen, master_addr or "", port, number)
    world = sum(p.nproc for p in plans)
    if number == 0:
        say(f"preflight passed on {len(chosen)} hosts in {time.monotonic() - started:.1f}s; "
            f"master {master_addr}:{port}" + (f", world size {world}" if launch.job.elastic else ""))
    else:
        say(start_line(number, [p.host for p in plans], world, selection.left_out + list(dead.items())))
    return _Start(chosen, plans, master_addr or "", port)


def _port(launch: _Launch, number: int) -> int:
    """The master port: the user's, else derived from the run id; a restart derives a new one,
    so no socket of the last attempt (TIME_WAIT, a slow exit) can be in the way."""
    run = launch.run_id if number == 0 else f"{launch.run_id}.{number}"
    return choose_port(run, launch.options.master_port, launch.job.master.port)


def _probe(launch: _Launch, hosts: Sequence[Host], master_addr: str, master_port: int) -> list[HostSession]:
    """Connect to and probe every host in parallel; each host's problems are in its session."""
    if len(hosts) > 1 and is_loopback(master_addr):
        raise RemoteError(f"master address {master_addr} is loopback, but the job spans {len(hosts)} hosts",
                          "set master.addr to an address the other hosts can reach")

    def request(node_rank: int, host: Host) -> dict[str, Any]:
        return {"cwd": launch.cwd, "env": launch.base_env, "master_addr": master_addr, "master_port": master_port,
                "check_port": node_rank == 0, "paths": launch.paths}

    sessions = start_sessions(hosts, launch.settings, launch.python, request, launch.job.ssh.parallel,
                              probe_timeout=max(30.0, 3 * launch.settings.timeout))
    if launch.options.on_probed is not None:
        launch.options.on_probed(sessions)
    cluster = check_hosts(sessions, HeadFacts.here())
    if cluster:
        raise_problems(sessions, cluster)
    for session in sessions:
        if not session.problems:
            count, why = _nproc(launch.job, launch.options, session)
            if launch.job.backend == "nccl" and session.facts["gpus"] < count:
                session.problems.append(f"backend nccl needs a GPU per worker: {count} workers, "
                                        f"{session.facts['gpus']} GPUs visible")
            if count < 1:
                session.problems.append(f"no workers to run ({why})")
    return sessions


def _failure(outcome: Outcome) -> str | None:
    """``cdssh4: connection lost (...)``, the first failure of an attempt, for its report line."""
    root = outcome.root
    if root is not None:
        cause = (root.result or {}).get("root_cause")
        if root.lost:
            return f"{root.name}: {root.lost}"
        if cause:
            how = f"killed by {cause['signal']}" if cause.get("signal") else f"exit code {cause.get('exit_code')}"
            return f"{root.name}: rank {cause.get('rank')} {how}"
        return f"{root.name}: {launcher_end(root)}"
    if outcome.exit_code != 0:
        return outcome.stop_reason or "a host failed"
    return None


def _pause(seconds: float, stop: _Stop) -> bool:
    """Wait before a restart; True when a stop signal came meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop.signum is not None:
            return True
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    return stop.signum is not None


def _finish(attempts: Sequence[Attempt], say: Callable[[str], None]) -> int:
    """The job's exit code (its last attempt's); after restarts, one line per attempt."""
    if len(attempts) > 1:
        say(f"{len(attempts)} attempts:")
        for attempt in attempts:
            say(f"  {attempt.line()}")
    return attempts[-1].exit_code if attempts else 1


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


def _run(launch: _Launch, start: _Start, number: int, stop: _Stop) -> Outcome:
    """One attempt: GO to every chosen host, relay until the end, report its failure."""
    job, err = launch.job, launch.err
    log_dir = Path(job.logs.dir) / launch.run_id
    log_dir.mkdir(parents=True, exist_ok=True)
    launchers = [RemoteLauncher(session=s, plan=p, log=open(log_dir / f"ssh-{s.host.name}.log", "ab"))
                 for s, p in zip(start.sessions, start.plans)]
    if number:
        for launcher in launchers:
            launcher.log.write(f"--- clusterddp: restart {number} ({time.strftime('%Y-%m-%d %H:%M:%S')}) ---\n"
                               .encode())
    write_launcher_file(log_dir, socket.gethostname(), launch.run_id,
                        list(range(sum(p.nproc for p in start.plans))), hosts=[p.host for p in start.plans])
    relay = Relay(launchers, launch.out, err, launch.settings, grace_period=job.grace_period,
                  heartbeat_interval=launch.options.heartbeat_interval, log_dir=log_dir)
    stop.relay = relay
    if stop.signum is not None:
        relay.request_stop(f"{signal.Signals(stop.signum).name} on the head", stop.signum)
    try:
        outcome = relay.run()
    finally:
        stop.relay = None
        for launcher in launchers:
            launcher.log.close()
    report = format_outcome(job.name, outcome)
    if report:
        err.write((report + f"\n  head's copy of each host's output: {log_dir}/ssh-<host>.log\n").encode())
        err.flush()
    return outcome


def head_launch_env(job: JobSpec, head_env: Mapping[str, str]) -> dict[str, str]:
    """What every host's launcher gets from the head: the allow-list, ``ssh.env_allow``, the
    ``env_passthrough`` variables (an unset one is an error before any host is contacted), then
    the job's ``env:``."""
    passthrough_env(job.env_passthrough, head_env, job.source or "<command line>", job.env)
    return {**forwarded_env(head_env, job.ssh.env_allow, job.env_passthrough), **job.env}


def _plans(launch: _Launch, sessions: Sequence[HostSession], master_addr: str, master_port: int,
           number: int) -> list[LaunchPlan]:
    """One plan per chosen host. Hosts may run different numbers of workers (slots): each
    launcher then gets every node's count (``--workers-per-node``), and global ranks are
    their prefix sums in node-rank order, as torch elastic assigns them."""
    job, options = launch.job, launch.options
    counts = [_nproc(job, options, session)[0] for session in sessions]
    layout = ["--workers-per-node", ",".join(str(c) for c in counts)] if len(set(counts)) > 1 else []
    restart = ["--restart-count", str(number)]
    plans = []
    for session, nproc in zip(sessions, counts):
        route = session.facts.get("route") or {}
        interface = job.ssh.interface or route.get("dev")
        argv = launcher_argv(session.facts["executable"], launch.target, nnodes=len(sessions),
                             node_rank=session.node_rank, master_addr=master_addr, master_port=master_port,
                             run_id=launch.run_id, nproc=nproc, heartbeat_timeout=options.heartbeat_timeout,
                             extra=(*restart, *layout, *options.launcher_args))
        plans.append(LaunchPlan(host=session.host.name, node_rank=session.node_rank, nproc=nproc, argv=argv,
                                env=launcher_env(launch.base_env, job.env, interface), cwd=launch.cwd,
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
    """The rank table (each host's ranks: prefix sums of the workers before it) and, per host,
    the exact command its launcher would run."""
    counts = [plan.nproc for plan in plans]
    workers = f"{counts[0]} workers" if len(set(counts)) == 1 else "(" + "+".join(map(str, counts)) + ") workers"
    lines = [f"job '{job.name}': {len(plans)} hosts x {workers} = world size {sum(counts)}, "
             f"master {master_addr}:{master_port}, run id {run_id}",
             f"  {'node':<5} {'host':<16} {'address':<16} {'ranks':<12} {'interface':<10} python"]
    first = 0
    for plan, session in zip(plans, sessions):
        ranks = f"{first}-{first + plan.nproc - 1}" if plan.nproc > 1 else str(first)
        first += plan.nproc
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
