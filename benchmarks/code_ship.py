"""Shipping a code tree to SSH hosts (issue 34, goal 2): clusterddp's ``code:`` shipment to 16
hosts against one ``rsync -a`` of the same tree to one host, with a loop of rsync and pdcp to
the 16 hosts beside it; then an unchanged re-run and a one-file edit.

The tree: 10,000 files, 50 MB (sizes 1-10 KiB, a few of 200 KiB-2 MiB), random bytes (rsync's
compression would otherwise flatter it; none of the tools compresses here). Hosts are the SSH
test bed's (tests/testbed: a network namespace and a real sshd each, all on this machine's
cores), each with a private tmpfs for every destination (``ssh_lab(private=...)``), so no host
sees another's copy. rsync and pdcp run over OpenSSH with the lab's ssh_config; clusterddp over
its own paramiko connection (what ``clusterddp run`` does in PROBING: connect, ship, check).
"clusterddp" times connecting + shipping + the host's check of the tree hash; the head's walk
and hashing of the tree (once per job, whatever the host count) is timed apart.

    sudo .venv/bin/python benchmarks/code_ship.py [--hosts 16] [--files 10000] [--mb 50]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clusterddp.codetree.transfer import CodePlan  # noqa: E402
from clusterddp.codetree.walk import scan  # noqa: E402
from clusterddp.launch.ssh.hosts import job_hosts  # noqa: E402
from clusterddp.launch.ssh.reach import ConnectSettings, HostSession, open_client, ship_code  # noqa: E402
from clusterddp.spec import load_job  # noqa: E402
from tests.testbed import lab_unavailable_reason, ssh_lab  # noqa: E402


def make_tree(root: Path, files: int, total_mb: int, seed: int = 34) -> None:
    rng = random.Random(seed)
    big = max(1, files // 1000)  # a few large files, as checkpoints-free code trees have (data, assets)
    budget = total_mb * 10**6
    sizes = [rng.randint(200 << 10, 2 << 20) for _ in range(big)]
    small_total = budget - sum(sizes)
    mean = small_total / (files - big)
    sizes += [max(1, int(rng.uniform(0.2, 1.8) * mean)) for _ in range(files - big)]
    for k, size in enumerate(sizes):
        path = root / f"pkg{k % 37}" / f"mod{k % 11}" / f"f{k}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({done.returncode}): {(done.stdout + done.stderr)[-800:]}")
    return time.perf_counter() - start


def ship_all(sessions_hosts: list, settings: ConnectSettings, code: CodePlan) -> tuple[float, int]:
    """Connect to every host and ship the tree, all at once (as PROBING does); wall, bytes sent."""
    def one(host: object) -> int:
        session = HostSession(host=host, node_rank=0)  # type: ignore[arg-type]
        session.client = open_client(host, settings)  # type: ignore[arg-type]
        try:
            ship_code(session, code, sys.executable, 600)
            return session.code_sent
        finally:
            session.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=64) as pool:
        sent = sum(pool.map(one, sessions_hosts))
    return time.perf_counter() - start, sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--mb", type=int, default=50)
    args = parser.parse_args()
    reason = lab_unavailable_reason()
    if reason or shutil.which("rsync") is None:
        print(f"cannot run: {reason or 'rsync is not installed (apt-get install --no-install-recommends rsync)'}",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="cdship-bench-"))
    dest = work / "dest"
    dest.mkdir()
    src = work / "src"
    make_tree(src, args.files, args.mb)
    rows: list[tuple[str, float, str]] = []
    try:
        with ssh_lab(args.hosts, private=[str(dest)]) as lab:
            job = work / "job.yaml"
            (work / "x.py").write_text("")
            job.write_text(f"name: ship\nscript: x.py\nssh:\n  config_file: {lab.ssh_config}\n")
            spec = load_job(job)
            hosts = job_hosts(spec, str(lab.hostfile), (), (), False)
            settings = ConnectSettings(timeout=30)
            ssh = f"ssh -F {lab.ssh_config}"
            first = lab.hosts[0].name

            rows.append(("rsync -a, 1 host", timed(["rsync", "-a", "-e", ssh, f"{src}/", f"{first}:{dest}/rsync/"]),
                         "the anchor"))
            start = time.perf_counter()
            tree = scan(str(src))
            hash_s = time.perf_counter() - start
            code = CodePlan(tree=tree, cache=str(dest / "cache"))
            cold, sent = ship_all(hosts, settings, code)
            rows.append((f"clusterddp, {args.hosts} hosts, cold caches", cold,
                         f"{sent / 1e6:.1f} MB of files sent; head walk+hash {hash_s:.2f}s once per job"))
            loop = 0.0
            for host in lab.hosts:
                loop += timed(["rsync", "-a", "-e", ssh, f"{src}/", f"{host.name}:{dest}/rsyncloop/"])
            rows.append((f"loop of rsync -a, {args.hosts} hosts", loop, "one after another"))
            if shutil.which("pdcp"):
                env = {**os.environ, "PDSH_SSH_ARGS": f"-F {lab.ssh_config} -x -a -l%u %h"}
                names = ",".join(h.name for h in lab.hosts)
                rows.append((f"pdcp -r, {args.hosts} hosts", timed(["pdcp", "-R", "ssh", "-f", "64", "-w", names, "-r",
                                                                    str(src), f"{dest}/"], env), "fan-out 64"))
            rows.append(("rsync -a again, 1 host, unchanged",
                         timed(["rsync", "-a", "-e", ssh, f"{src}/", f"{first}:{dest}/rsync/"]), ""))
            start = time.perf_counter()
            tree = scan(str(src))
            hash_s = time.perf_counter() - start
            warm, sent = ship_all(hosts, settings, CodePlan(tree=tree, cache=str(dest / "cache")))
            rows.append((f"clusterddp, {args.hosts} hosts, unchanged", warm,
                         f"{sent} file bytes sent; head walk+hash {hash_s:.2f}s"))
            edited = next(src.rglob("f7.py"))
            edited.write_bytes(os.urandom(4321))
            tree = scan(str(src))
            one, sent = ship_all(hosts, settings, CodePlan(tree=tree, cache=str(dest / "cache")))
            rows.append((f"clusterddp, {args.hosts} hosts, one file edited", one,
                         f"{sent} file bytes sent ({sent // args.hosts} per host)"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    anchor = rows[0][1]
    print(f"tree: {args.files} files, {args.mb} MB; {args.hosts} hosts; {os.cpu_count()} CPUs shared by all hosts")
    print(f"{'what':<44} {'wall s':>7} {'x rsync':>8}  notes")
    for name, seconds, note in rows:
        print(f"{name:<44} {seconds:7.2f} {seconds / anchor:8.2f}  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
