"""What the head's keepalive costs in steady state, and how soon it notices a cut link.

Each host is a network namespace with a real sshd (tests/testbed). The head opens one
connection per host as a run does (``reach.open_client``: keepalive, ``TCP_USER_TIMEOUT`` from
the link timeout) and a channel running ``cat >/dev/null``, a launcher that reads its stdin.

Cost, two ways: the CPU time of the thread that calls ``io.keepalive`` (paramiko encrypts and
writes each message in the sending thread), per keepalive per host; and the whole head
process's CPU time (paramiko's transport threads and the kernel's work charged to it too) over
windows with one ``io.keepalive`` every INTERVAL s, less a window without any, per keepalive
per host. The second is the honest one and the noisy one on shared cores. Detection: with
keepalives going, one host's veth goes down; the time until its transport ends is how long
the head takes to notice (the relay's loop sees it on its next 0.1 s turn).

    sudo .venv/bin/python benchmarks/ssh_keepalive.py [--hosts 16] [--seconds 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import paramiko  # noqa: E402

from clusterddp.hostfile import entries_from_list  # noqa: E402
from clusterddp.launch.ssh import io  # noqa: E402
from clusterddp.launch.ssh.attempt import keepalive_interval  # noqa: E402
from clusterddp.launch.ssh.hosts import Host, resolve_hosts  # noqa: E402
from clusterddp.launch.ssh.io import RemoteLauncher  # noqa: E402
from clusterddp.launch.ssh.reach import ConnectSettings, HostSession, LaunchPlan, open_client  # noqa: E402
from clusterddp.sections.ssh import SSHSpec  # noqa: E402
from tests.testbed import SSHLab, lab_unavailable_reason, ssh_lab  # noqa: E402


def _connect(host: Host, node_rank: int, settings: ConnectSettings) -> RemoteLauncher:
    client = open_client(host, settings)
    channel = client.get_transport().open_session()  # type: ignore[union-attr]
    channel.exec_command("exec cat >/dev/null")
    session = HostSession(host=host, node_rank=node_rank, link_timeout=settings.link_timeout, client=client,
                          channel=channel)
    return RemoteLauncher(session, LaunchPlan(host=host.name, node_rank=node_rank, nproc=1, argv=()),
                          log=None)  # type: ignore[arg-type]


def _hosts(lab: SSHLab) -> list[Host]:
    config = paramiko.SSHConfig.from_path(str(lab.ssh_config))
    return resolve_hosts(entries_from_list([h.name for h in lab.hosts], "lab"),
                         SSHSpec(config_file=str(lab.ssh_config)), config)


def cpu_over(launchers: list[RemoteLauncher], seconds: float, interval: float | None) -> tuple[float, float, int]:
    """Over ``seconds`` with a keepalive every ``interval`` (None: none): the head's CPU seconds,
    the sending thread's CPU seconds inside ``io.keepalive``, and the keepalives each host got."""
    start, cpu, sending = time.monotonic(), time.process_time(), 0.0
    deadline, beats, next_beat = start + seconds, 0, start
    while (now := time.monotonic()) < deadline:
        if interval is not None and now >= next_beat:
            before = time.thread_time()
            io.keepalive(launchers)
            sending += time.thread_time() - before
            beats += 1
            next_beat += interval
        wake = deadline if interval is None else min(next_beat, deadline)
        time.sleep(max(0.0, wake - time.monotonic()))
    return time.process_time() - cpu, sending, beats


def detection(lab: SSHLab, host: Host, settings: ConnectSettings, interval: float) -> float:
    """Seconds from cutting the host's link, keepalives going, to its transport's end."""
    launcher = _connect(host, 0, settings)
    transport = launcher.channel.get_transport()
    try:
        time.sleep(0.5)
        lab.cut(lab.host(host.name))
        cut = next_beat = time.monotonic()
        while transport.is_active():
            now = time.monotonic()
            if now >= next_beat:
                io.keepalive([launcher])
                next_beat = now + interval
            if now - cut > 30:
                raise SystemExit(f"{host.name}: link cut 30 s ago and the transport is still up")
            time.sleep(0.01)
        return time.monotonic() - cut
    finally:
        lab.restore(lab.host(host.name))
        launcher.session.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0, help="each CPU window")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--link-timeouts", type=float, nargs="*", default=[1.0, 2.5])
    args = parser.parse_args()
    reason = lab_unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with ssh_lab(args.hosts) as lab:
        hosts = _hosts(lab)
        launchers = [_connect(h, i, ConnectSettings(timeout=10)) for i, h in enumerate(hosts)]
        try:
            time.sleep(1.0)  # handshakes and the first window adjustments settled
            process: dict[float, list[float]] = {1.0: [], 0.25: []}
            thread: dict[float, list[float]] = {1.0: [], 0.25: []}
            idle_cpu = []
            for _ in range(args.repeat):
                idle, _, _ = cpu_over(launchers, args.seconds, None)
                idle_cpu.append(idle)
                for interval in process:
                    cpu, sending, beats = cpu_over(launchers, args.seconds, interval)
                    process[interval].append((cpu - idle) / (beats * len(launchers)))
                    thread[interval].append(sending / (beats * len(launchers)))
        finally:
            for launcher in launchers:
                launcher.session.close()
        print(f"{args.hosts} hosts, {args.seconds:g} s windows, median of {args.repeat}; head CPU without "
              f"keepalives: {1000 * statistics.median(idle_cpu) / args.seconds / args.hosts:.2f} ms/s per host")
        for interval in process:
            sent, whole = statistics.median(thread[interval]), statistics.median(process[interval])
            print(f"keepalive every {interval:g} s, per keepalive per host: {1e6 * sent:.0f} us sending, "
                  f"{1e6 * whole:.0f} us of the whole head (runs: {', '.join(f'{1e6 * c:.0f}' for c in process[interval])})"
                  f"; for 1,000 hosts {100 * sent / interval * 1000:.1f}% / {100 * whole / interval * 1000:.1f}% of a core")
        for link_timeout in args.link_timeouts:
            interval = keepalive_interval(None, link_timeout)
            settings = ConnectSettings(timeout=10, link_timeout=link_timeout)
            seconds = [detection(lab, hosts[i % len(hosts)], settings, interval) for i in range(args.repeat)]
            print(f"link_timeout {link_timeout:g} s (keepalive every {interval:g} s): cut link noticed after "
                  f"{', '.join(f'{s:.2f}' for s in seconds)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
