"""One attempt of a fan-out: probe the candidate hosts, choose the ones it runs on, and plan
each one's launcher (the exact argv and env its stub will ``execve``, built here from parts:
``launcher_argv``, ``launcher_env``); then, once it ended, whether there is a next one.

``fanout`` runs attempts; the rules for choosing hosts are ``hosts``' (``choose_hosts``).
Everything here talks to hosts only through ``reach`` (connect, stub, preflight).

The head owns restarts of a fan-out (``restarts: N``): any failure (a rank's non-zero exit, a
lost host, a hang) ends the attempt on every host, then the whole job starts again on every
host with the same run id and ``--restart-count K`` (TORCHELASTIC_RESTART_COUNT=K), in place
on the launchers that wait for it where it can (``inplace``), else probed and launched anew
(``prepare``). No host ever restarts its own group alone: its peers would not come back with it. ``Attempt``,
``next_backoff`` and the lines below are pure functions over plain data.
"""

from __future__ import annotations

import fnmatch
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterable, Mapping, Sequence

from clusterddp.codetree.gitstate import git_state
from clusterddp.codetree.transfer import DEFAULT_CACHE, CodePlan
from clusterddp.codetree.walk import CodeTreeError, scan
from clusterddp.errors import RemoteError
from clusterddp.launch.restart.policy import RestartPolicy, attempt_line
from clusterddp.launch.ssh.hosts import Host, choose_hosts, job_hosts, too_few
from clusterddp.launch.ssh.io import Console
from clusterddp.launch.ssh.reach import (ConnectSettings, HeadFacts, HostSession, LaunchPlan, PreflightError,
                                         check_hosts, raise_problems, start_sessions)
from clusterddp.redact import passthrough_env
from clusterddp.spec import JobSpec
from clusterddp.topology import choose_port, count_workers, default_run_id, is_loopback


#: Head variables every remote launcher gets (names, or prefixes ending in '*'). Per-host
#: variables (CUDA_VISIBLE_DEVICES, LD_LIBRARY_PATH, PATH, HOME) are deliberately absent:
#: the remote host's own values are the right ones.
ENV_ALLOW: tuple[str, ...] = (
    "NCCL_*", "GLOO_*", "TORCH_*", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER",
    "PYTHONWARNINGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
)
#: Set from the detected route to the master unless the user set them.
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


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
    #: Seconds between the head's keepalives; None: from the link timeout (``keepalive_interval``).
    keepalive_interval: float | None = None
    keepalive_timeout: float = 6.0
    stdout: BinaryIO | None = None
    stderr: BinaryIO | None = None
    #: Run this instead of the job's script (``("-m", "pkg.mod", ...)``): the job still gives
    #: hosts, env, interpreter and workers per host. ``clusterddp doctor`` runs its worker so.
    command: tuple[str, ...] | None = None
    #: Called with every host's session once all probes are in, before the checks: the
    #: doctor prints each host's facts even when some host fails preflight.
    on_probed: Callable[[Sequence[HostSession]], None] | None = None


@dataclass(frozen=True)
class Launch:
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
    #: The head's stdout and stderr: everything the head prints goes through it, masked.
    console: Console
    #: Seconds between the head's keepalives to every host (``keepalive_interval``, resolved once).
    keepalive_interval: float
    #: The code tree shipped to every host (``code:``); None: the hosts see the head's paths.
    code: CodePlan | None = None


def launch_of(job: JobSpec, options: FanoutOptions) -> Launch:
    """The fan-out of ``job`` as ``options`` change it, settled and checked before any host
    is contacted, in this order: the hosts (``hosts.job_hosts``), ``nodes`` against them,
    a loopback master, the ``env_passthrough`` variables."""
    hosts = job_hosts(job, options.hostfile, options.include, options.exclude, options.dry_run)
    low, high = node_bounds(job, len(hosts))
    master_addr = options.master_addr or job.master.addr
    refuse_loopback(master_addr, min(high, len(hosts)))  # the user's address
    settings = ConnectSettings(timeout=job.ssh.connect_timeout, accept_new_host_keys=job.ssh.accept_new_host_keys,
                               link_timeout=job.ssh.link_timeout)
    interval = keepalive_interval(options.keepalive_interval, settings.link_timeout)
    target, paths = _target(job, options)
    run_id = options.run_id or default_run_id(job.name)  # handed to every host: unique
    base_env = head_launch_env(job, os.environ if options.head_env is None else options.head_env)
    code = code_plan(job)
    return Launch(code=code, job=job, options=options, hosts=hosts, settings=settings, run_id=run_id, master_addr=master_addr,
                  python=job.python or sys.executable, cwd=options.cwd or os.getcwd(), base_env=base_env,
                  target=target, paths=paths, low=low, high=high, keepalive_interval=interval,
                  console=Console(options.stdout or sys.stdout.buffer, options.stderr or sys.stderr.buffer))


def code_plan(job: JobSpec) -> CodePlan | None:
    """The job's code tree walked and hashed (``code:``), before any host is contacted; a tree
    that cannot be shipped is one line. The job's own log directory stays home when it is
    inside the tree (the logs of earlier runs are not code)."""
    root = job.code_dir()
    if root is None:
        return None
    exclude = list(job.code.exclude)
    logs = os.path.abspath(job.logs.dir)
    if os.path.commonpath([logs, root]) == root and logs != root:
        exclude.append("/" + os.path.relpath(logs, root) + "/")
    try:
        tree = scan(root, tuple(exclude), int(job.code.max_mb * 2**20))
    except CodeTreeError as exc:
        raise RemoteError(f"{job.where('code.dir')}: {exc}") from None
    return CodePlan(tree=tree, cache=job.code.cache or DEFAULT_CACHE, git=git_state(root))


def node_bounds(job: JobSpec, listed: int) -> tuple[int, int]:
    """(MIN, MAX) hosts per attempt: the job's ``nodes: "MIN:MAX"``, else every one of the
    ``listed`` hosts."""
    if not job.elastic:
        return listed, listed
    low, high = job.node_range
    if listed < low:
        raise RemoteError(f"{job.where('nodes')}: {job.nodes!r} needs at least {low} hosts, "
                          f"{listed} listed", "list more hosts (spares welcome), or lower MIN")
    return low, high


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


def head_launch_env(job: JobSpec, head_env: Mapping[str, str]) -> dict[str, str]:
    """What every host's launcher gets from the head: the allow-list, ``ssh.env_allow``, the
    ``env_passthrough`` variables (an unset one is an error before any host is contacted), then
    the job's ``env:``."""
    env = {**forwarded_env(head_env, job.ssh.env_allow, job.env_passthrough), **job.env}
    passthrough_env(job.env_passthrough, head_env, job.source or "<command line>", job.env, job.line_of)
    return env


def keepalive_interval(explicit: float | None, link_timeout: float) -> float:
    """Seconds between the head's keepalives: ``explicit`` when given, else min(1 s, a quarter
    of the link timeout). A cut link is noticed once the head's data has gone unacknowledged for
    the link timeout (``reach``: TCP_USER_TIMEOUT, which Linux counts from its first resend, one
    retransmission timeout after the send), and there is data only from the next keepalive on:
    a dead host is named within link timeout + interval + that, about 1.5 s by default."""
    return explicit if explicit is not None else min(1.0, link_timeout / 4)


@dataclass
class Start:
    """One attempt's hosts (probed, chosen, node ranks given) and their launchers' plans."""

    sessions: list[HostSession]
    plans: list[LaunchPlan]
    master_addr: str
    master_port: int
    #: Candidates not chosen, and why (said again when the attempt is restarted in place).
    left_out: list[tuple[str, str]] = field(default_factory=list)
    #: Restarted in place on fewer hosts than the last attempt: each launcher is told its new
    #: node rank and every node's workers (``protocol.restart_word``'s layout).
    renumbered: bool = False
    #: Node 0 was lost and the master moved to the next one (said in the restart word).
    master_moved: bool = False


def prepare(launch: Launch, number: int, dead: dict[str, str]) -> Start:
    """Probe the candidates, choose this attempt's hosts, and plan each one's launcher.

    Node 0's address is the master unless the user gave one; when the first candidate is
    left out, the chosen hosts are probed once more against the new master (its route and
    port are part of the probe)."""
    candidates = [h for h in launch.hosts if h.name not in dead]
    started = time.monotonic()
    sessions: list[HostSession] = []
    try:
        for _ in range(2):
            master_addr = launch.master_addr or (address_of(candidates[0]) if candidates else None)
            port = master_port(launch, number)
            sessions = probe(launch, candidates, master_addr or "", port)
            selection = choose_hosts([(s.host.name, s, s.problems) for s in sessions], launch.high)
            chosen: list[HostSession] = selection.chosen
            if not launch.job.elastic:
                raise_problems(sessions)  # a fixed node count: every host or none
            problem = too_few(len(chosen), launch.low, launch.high)
            if problem is not None:
                problems = {**{name: [why] for name, why in dead.items()},
                            **{s.label: s.problems for s in sessions if s.problems}}
                raise PreflightError(problems, len(launch.hosts), [problem])
            if launch.master_addr or not chosen or chosen[0] is sessions[0]:
                break
            _close(sessions)  # node 0 changed: probe the chosen hosts against it
            candidates = [s.host for s in chosen]
    except BaseException:
        _close(sessions)  # their stubs see EOF and exit, nothing started
        raise
    _close(s for s in sessions if s not in chosen)
    for node_rank, session in enumerate(chosen):
        session.node_rank = node_rank
    plans = plan_launchers(launch, chosen, master_addr or "", port, number)
    world = sum(p.nproc for p in plans)
    left_out = selection.left_out + list(dead.items())
    if number == 0:
        launch.console.say(f"preflight passed on {len(chosen)} hosts in {time.monotonic() - started:.1f}s; "
            f"master {master_addr}:{port}" + (f", world size {world}" if launch.job.elastic else ""))
    else:
        launch.console.say(start_line(number, [p.host for p in plans], world, left_out))
    if launch.code is not None:
        launch.console.say(code_line(launch.code, chosen))
    return Start(chosen, plans, master_addr or "", port, left_out)


def code_line(code: CodePlan, sessions: Sequence[HostSession]) -> str:
    """``code tree 1a2b3c4d5e6f (120 files, 1.2 MiB) checked on 4 hosts; sent 3 files' 0.1 MiB``."""
    tree = code.tree
    sent = sum(s.code_sent for s in sessions)
    origin = f"git {code.git.commit[:12]}{' + uncommitted changes' if code.git.dirty else ''}" if code.git.commit else "no git"
    return (f"code tree {tree.digest[:12]} ({len(tree.entries)} files, {tree.size / 2**20:.1f} MiB, {origin}) "
            f"checked on {len(sessions)} hosts; sent {sent / 2**20:.2f} MiB ({sent} bytes)")


def _close(sessions: Iterable[HostSession]) -> None:
    for session in sessions:
        session.close()


def refuse_loopback(master_addr: str | None, hosts: int) -> None:
    """A loopback master is reachable from its own host only: one line before anything starts."""
    if hosts > 1 and is_loopback(master_addr):
        raise RemoteError(f"master address {master_addr} is loopback, but the job spans {hosts} hosts",
                          "set master.addr to an address the other hosts can reach")


def master_port(launch: Launch, number: int) -> int:
    """The master port: the user's, else derived from the run id; a restart derives a new one,
    so no socket of the last attempt (TIME_WAIT, a slow exit) can be in the way."""
    run = launch.run_id if number == 0 else f"{launch.run_id}.{number}"
    return choose_port(run, launch.options.master_port, launch.job.master.port)


def probe(launch: Launch, hosts: Sequence[Host], master_addr: str, master_port: int) -> list[HostSession]:
    """Connect to and probe every host in parallel; each host's problems are in its session."""
    refuse_loopback(master_addr, min(len(hosts), launch.high))

    def request(node_rank: int, host: Host) -> dict[str, Any]:
        return {"cwd": launch.cwd, "env": launch.base_env, "master_addr": master_addr, "master_port": master_port,
                "check_port": node_rank == 0, "paths": launch.paths}

    sessions = start_sessions(hosts, launch.settings, launch.python, request, launch.job.ssh.parallel,
                              probe_timeout=max(30.0, 3 * launch.settings.timeout), code=launch.code)
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


def plan_launchers(launch: Launch, sessions: Sequence[HostSession], master_addr: str, master_port: int,
                   number: int) -> list[LaunchPlan]:
    """One plan per chosen host. Hosts may run different numbers of workers (slots): each
    launcher then gets every node's count (``--workers-per-node``), and global ranks are
    their prefix sums in node-rank order, as torch elastic assigns them."""
    job, options = launch.job, launch.options
    counts = [_nproc(job, options, session)[0] for session in sessions]
    layout = ["--workers-per-node", ",".join(str(c) for c in counts)] if len(set(counts)) > 1 else []
    # while restarts are left, a failed attempt's launchers wait for the next one (inplace.py)
    restart = ["--restart-count", str(number), *(["--await-restart"] if number < job.restarts else [])]
    plans = []
    for session, nproc in zip(sessions, counts):
        route = session.facts.get("route") or {}
        interface = job.ssh.interface or route.get("dev")
        target = [session.remote_path(word, launch.code) if os.path.isabs(word) else word for word in launch.target]
        argv = launcher_argv(session.facts["executable"], target, nnodes=len(sessions),
                             node_rank=session.node_rank, master_addr=master_addr, master_port=master_port,
                             run_id=launch.run_id, nproc=nproc, keepalive_timeout=options.keepalive_timeout,
                             extra=(*restart, *layout, *options.launcher_args))
        plans.append(LaunchPlan(host=session.host.name, node_rank=session.node_rank, nproc=nproc, argv=argv,
                                env=launcher_env(launch.base_env, job.env, interface),
                                cwd=session.remote_path(launch.cwd, launch.code),
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


def address_of(host: Host) -> str | None:
    """Node 0's address as the other hosts should reach it (None: connect will name the problem)."""
    try:
        return str(socket.getaddrinfo(host.address, host.port, type=socket.SOCK_STREAM)[0][4][0])
    except socket.gaierror:
        return None


@dataclass(frozen=True)
class Attempt:
    """One start of the whole job, as the final report lists it."""

    #: 0 for the first start; TORCHELASTIC_RESTART_COUNT of its workers.
    number: int
    hosts: tuple[str, ...]
    world_size: int
    exit_code: int
    #: ``cdssh4: connection lost (...)``: the first failure, if any.
    failure: str | None
    seconds: float

    def line(self) -> str:
        """``attempt 1: 4 hosts (world size 4) cdssh1,...: exit 255 after 12.3s, cdssh4: ...``"""
        hosts = ",".join(self.hosts) if len(self.hosts) <= 8 else f"{','.join(self.hosts[:8])},..."
        return attempt_line(self.number, f"{len(self.hosts)} host(s) (world size {self.world_size}) {hosts}",
                            self.exit_code, self.seconds, self.failure)


def next_backoff(attempts: Sequence[Attempt], restarts: int, stopping: bool) -> float | None:
    """Seconds to wait before the next attempt, or None when the last one ends the job: it
    succeeded, the head was told to stop, the restarts are used up, or its exit is one a
    restart cannot fix (75: preempted, the scheduler's business; 65: non-finite loss)."""
    last = attempts[-1]
    return RestartPolicy(restarts).backoff(last.number, last.exit_code or None, stopping)


def restart_line(last: Attempt, restarts: int, backoff: float, dead: dict[str, str]) -> str:
    """The one line a restart prints: which attempt failed and why, what comes next."""
    text = (f"attempt {last.number + 1} failed ({last.failure or f'exit {last.exit_code}'}); "
            f"restarting the whole job in {backoff:.0f}s (restart {last.number + 1} of {restarts})")
    if dead:
        text += "; left out: " + ", ".join(f"{name} ({why})" for name, why in dead.items())
    return text


def start_line(number: int, hosts: Sequence[str], world_size: int, left_out: Sequence[tuple[str, str]]) -> str:
    """The line a restarted attempt prints once its hosts are chosen."""
    text = f"restart {number}: {len(hosts)} host(s) {','.join(hosts)} (world size {world_size})"
    if left_out:
        text += "; not used: " + "; ".join(f"{name}: {why}" for name, why in left_out)
    return text


def forwarded_env(head_env: Mapping[str, str], extra: Iterable[str] = (),
                  passthrough: Iterable[str] = ()) -> dict[str, str]:
    """The head's variables on the allow-list (plus ``ssh.env_allow``), and the job's
    ``env_passthrough`` names, exactly (they travel in the stub's JSON, never in a shell line)."""
    patterns = (*ENV_ALLOW, *extra)
    names = set(passthrough)
    return {k: v for k, v in head_env.items()
            if k in names or any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def launcher_env(base: Mapping[str, str], job_env: Mapping[str, str], interface: str | None) -> dict[str, str]:
    """Forwarded head env, then the detected interface (unless already set), then the job's env."""
    env = dict(base)
    if interface:
        for name in IFNAME_VARS:
            if name not in job_env and name not in base:
                env[name] = interface
    env.update(job_env)
    return env


def launcher_argv(python: str, target: list[str], *, nnodes: int, node_rank: int, master_addr: str,
                  master_port: int, run_id: str, nproc: int, keepalive_timeout: float,
                  extra: Iterable[str] = ()) -> tuple[str, ...]:
    """``python -m clusterddp run JOB --nnodes ... --watch-stdin --emit-result [extra]``.

    ``target`` is ``[job_path]`` or ``["--", script, args...]`` (torchrun style, no job file);
    the ``--`` part goes last so the launcher's own flags cannot be mistaken for the script's.
    """
    job_part = [] if target and target[0] == "--" else list(target)
    command_part = list(target) if target and target[0] == "--" else []
    return (python, "-m", "clusterddp", "run", *job_part,
            "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--master-addr", master_addr, "--master-port", str(master_port),
            "--run-id", run_id, "--nproc-per-node", str(nproc),
            "--watch-stdin", "--keepalive-timeout", f"{keepalive_timeout:g}", "--emit-result",
            *extra, *command_part)
