"""The code travels with the job (``code:``): hosts that cannot see the head's files run the
job from the tree the head shipped into their own cache (issue 34, acceptance).

Each lab host has a private filesystem for the job's directory and the cache
(``ssh_lab(private=...)``: a tmpfs of its own mounted over each in the host's mount
namespace), so nothing but the shipment can bring the code there. Real sshd, real gloo
workers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.ssh.conftest import Head
from tests.testbed import SSHLab, lab_unavailable_reason, ssh_lab

pytestmark = pytest.mark.slow

WORKER = '''\
import hashlib, json, os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([1.0])
dist.all_reduce(value)
with open("data/msg.txt", encoding="utf-8") as f:  # relative to the job's directory
    msg = f.read().strip()
me = hashlib.sha256(open(__file__, "rb").read()).hexdigest()
print("SHIPPED " + json.dumps({"rank": dist.get_rank(), "host": socket.gethostname(), "cwd": os.getcwd(),
                               "msg": msg, "sum": value.item(), "script": __file__}), flush=True)
dist.destroy_process_group()
'''


@pytest.fixture
def private_lab(tmp_path: Path) -> Iterator[tuple[SSHLab, Path, Path]]:
    """Two hosts that see neither ``job`` nor ``cache`` of the head (each its own tmpfs)."""
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    job_dir, cache = tmp_path / "job", tmp_path / "cache"
    job_dir.mkdir()
    cache.mkdir()
    with ssh_lab(2, private=[str(job_dir), str(cache)]) as lab:
        yield lab, job_dir, cache


def write_tree(lab: SSHLab, job_dir: Path, cache: Path, msg: str = "first") -> Path:
    (job_dir / "data").mkdir(exist_ok=True)
    (job_dir / "data" / "msg.txt").write_text(msg + "\n")
    (job_dir / "train.py").write_text(WORKER)
    (job_dir / ".gitignore").write_text("outputs/\n")
    (job_dir / "outputs").mkdir(exist_ok=True)
    (job_dir / "outputs" / "big.bin").write_bytes(b"\0" * 1000)
    job = {"name": "ship", "script": "train.py", "nproc_per_node": 2, "grace_period": 2,
           "ssh": {"config_file": str(lab.ssh_config), "connect_timeout": 5},
           "code": {"dir": ".", "cache": str(cache)}}
    path = job_dir / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def run(job: Path, *extra: str) -> Head:
    head = Head([str(job), "--hostfile", str(job.parent.parent / "hostfile"), *extra], cwd=job.parent)
    return head


def shipped(head: Head) -> list[dict[str, object]]:
    return [json.loads(line.split("SHIPPED ", 1)[1]) for line in head.stdout if "SHIPPED " in line]


def code_line(head: Head) -> str:
    return next(line for line in head.stdout + head.stderr if "code tree " in line and "checked on" in line)


def test_hosts_without_the_heads_files_run_the_shipped_tree(private_lab: tuple[SSHLab, Path, Path]) -> None:
    lab, job_dir, cache = private_lab
    (job_dir.parent / "hostfile").write_text(lab.hostfile.read_text())
    job = write_tree(lab, job_dir, cache)
    # the hosts really cannot see the head's tree
    for host in lab.hosts:
        seen = subprocess.run(["ssh", "-F", str(lab.ssh_config), host.name, "ls", "-A", str(job_dir)],
                              capture_output=True, text=True, timeout=60)
        assert seen.stdout.strip() == "", f"{host.name} sees the head's files: {seen.stdout}"

    head = run(job)
    assert head.finish() == 0, head.output()
    ranks = shipped(head)
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3], head.output()
    digest = re.search(r"code tree ([0-9a-f]{12})", code_line(head)).group(1)  # type: ignore[union-attr]
    for r in ranks:
        assert str(r["cwd"]).startswith(f"{cache}/trees/{digest}"), r
        assert r["msg"] == "first" and r["sum"] == 4.0
        assert hashlib.sha256((job_dir / "train.py").read_bytes()).hexdigest() == \
            hashlib.sha256(WORKER.encode()).hexdigest()
    assert {r["host"] for r in ranks} == {h.name for h in lab.hosts}
    # the same tree hash on every host: each host's tree directory is named by it and checked
    for host in lab.hosts:
        listed = subprocess.run(["ssh", "-F", str(lab.ssh_config), host.name, "ls", f"{cache}/trees"],
                                capture_output=True, text=True, timeout=60).stdout.split()
        assert [name[:12] for name in listed] == [digest], (host.name, listed)
        ignored = subprocess.run(["ssh", "-F", str(lab.ssh_config), host.name, "ls",
                                  f"{cache}/trees/{listed[0]}"], capture_output=True, text=True, timeout=60)
        # .gitignore'd outputs/ stayed home; logs/ is the host launcher's own, written there
        assert sorted(ignored.stdout.split()) == ["data", "job.yaml", "logs", "train.py"], ignored.stdout
    assert "(0 bytes)" not in code_line(head)

    # unchanged: nothing travels
    again = run(job)
    assert again.finish() == 0, again.output()
    assert "sent 0.00 MiB (0 bytes)" in code_line(again), again.output()

    # an edit between two runs reaches every host, and only its bytes travel
    (job_dir / "data" / "msg.txt").write_text("second\n")
    edited = run(job)
    assert edited.finish() == 0, edited.output()
    assert {r["msg"] for r in shipped(edited)} == {"second"}, edited.output()
    assert f"({2 * len('second') + 2} bytes)" in code_line(edited), edited.output()  # 7 bytes to each of 2 hosts

    # the run record: tree hash, commit (none here: not a git work tree), in `clusterddp report`
    run_id = next(p.name for p in sorted((job_dir / "logs").iterdir(), key=lambda p: p.stat().st_mtime))
    report = subprocess.run([sys.executable, "-m", "clusterddp", "report", run_id], cwd=job_dir,
                            capture_output=True, text=True, timeout=60)
    assert f"code: tree {digest}" in report.stdout, report.stdout + report.stderr


def test_a_tree_that_does_not_check_fails_that_host_with_one_line(private_lab: tuple[SSHLab, Path, Path]) -> None:
    """A host whose store answers with another hash (here: a python wrapper on one host that
    damages the manifest's hash in transit is not needed: a corrupt cache is repaired, so the
    mismatch is forced by a cache path the host cannot write) fails preflight, naming it."""
    lab, job_dir, cache = private_lab
    (job_dir.parent / "hostfile").write_text(lab.hostfile.read_text())
    job = write_tree(lab, job_dir, cache)
    data = yaml.safe_load(job.read_text())
    data["code"]["cache"] = "/proc/cdship-cannot-write"
    job.write_text(yaml.safe_dump(data))
    head = run(job)
    assert head.finish() == 2, head.output()
    errors = "\n".join(head.stderr)
    assert "preflight failed on 2 of 2 hosts; nothing was started" in errors, head.output()
    for host in lab.hosts:
        assert re.search(rf"{host.name} .*code tree not stored: ", errors), head.output()
    assert not shipped(head)


def test_a_link_cut_mid_transfer_fails_that_host_and_leaves_no_tree(private_lab: tuple[SSHLab, Path, Path]) -> None:
    """The link of one host goes down while a big file is on its way there (seen as the store's
    temporary file in that host's cache): that host fails preflight in one line, nothing starts,
    and it holds no tree; once the link is back, the next run completes the tree."""
    lab, job_dir, cache = private_lab
    (job_dir.parent / "hostfile").write_text(lab.hostfile.read_text())
    job = write_tree(lab, job_dir, cache)
    (job_dir / "weights.bin").write_bytes(os.urandom(256 << 20))
    victim = lab.hosts[1]
    head = run(job)
    try:
        while True:  # wait for the file to be on its way (no time limit of ours: the head's own)
            found = subprocess.run(["nsenter", f"--target={victim.sshd_pid}", "--mount", "find", str(cache),
                                    "-name", ".in-*", "-size", "+1M"], capture_output=True, text=True).stdout
            if found.strip() or head.proc.poll() is not None:
                break
        assert head.proc.poll() is None, "the shipment ended before the link could be cut:\n" + head.output()
        lab.cut(victim)
        assert head.finish() == 2, head.output()
    finally:
        lab.restore(victim)
    errors = "\n".join(head.stderr)
    assert "preflight failed on 1 of 2 hosts; nothing was started" in errors, head.output()
    problem = [line for line in head.stderr if line.strip().startswith(victim.name)]
    assert len(problem) == 1 and "code tree: connection lost during the transfer" in problem[0], head.output()
    assert not shipped(head)
    trees = subprocess.run(["nsenter", f"--target={victim.sshd_pid}", "--mount", "ls", "-A", f"{cache}/trees"],
                           capture_output=True, text=True).stdout.split()
    assert [t for t in trees if not t.startswith(".")] == [], trees
    again = run(job)
    assert again.finish() == 0, again.output()
    print(problem[0])
