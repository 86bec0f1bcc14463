"""Preflight, dry run and host-key policies against real sshd hosts (network namespaces)."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ssh.conftest import write_job
from tests.testbed import SSHLab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_dry_run_prints_plan_and_starts_nothing(lab4: SSHLab, head_factory) -> None:
    """--dry-run probes every host, prints ranks, interface and command per host, starts no worker."""
    job = write_job(lab4, "wait_forever.py")
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile), "--dry-run")
    assert head.finish(60) == 0, head.output()
    text = "\n".join(head.stdout)
    assert "4 hosts x 2 workers = world size 8" in text
    assert re.search(r"^  3 +cdssh4 +10\.78\.0\.5 +6-7 +eth0", text, re.M), text
    assert text.count("GLOO_SOCKET_IFNAME=eth0") == 4 and "--node-rank 3" in text
    assert not any("ready" in line for line in head.stdout)
    clean, _, left = lab4.wait_clean(2)
    assert clean, left


def test_wrong_interpreter_reported_for_every_host(lab4: SSHLab, head_factory) -> None:
    """A different python on the hosts: every host's version and import problems listed at once."""
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3 to play the wrong interpreter")
    job = write_job(lab4, "wait_forever.py")
    job.write_text(job.read_text() + "python: /usr/bin/python3\n")
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish(60) == 2, head.output()
    stderr = "\n".join(head.stderr)
    assert "preflight failed on 4 of 4 hosts" in stderr
    for k in range(1, 5):
        assert re.search(rf"cdssh{k} .*: (python|clusterddp|torch)", stderr), stderr


def test_missing_interpreter_named(lab4: SSHLab, head_factory) -> None:
    """An interpreter path that does not exist on the hosts is named, with the shell's message."""
    job = write_job(lab4, "wait_forever.py")
    job.write_text(job.read_text() + "python: /no/such/python\n")
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile), "--include", "cdssh1,cdssh2")
    assert head.finish(60) == 2, head.output()
    lines = [line for line in head.stderr if "interpreter /no/such/python not found (exit 127)" in line]
    assert len(lines) == 2, head.output()


def test_master_port_busy_on_master_host(lab4: SSHLab, head_factory) -> None:
    """The master port already taken on node 0's host is reported before anything starts."""
    port = 29777
    holder = subprocess.Popen(["nsenter", f"--net={lab4.host(0).netns_path}", sys.executable, "-c",
                               f"import socket,time; s=socket.socket(); s.bind(('', {port})); s.listen();"
                               "print('bound', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"bound"
        job = write_job(lab4, "wait_forever.py")
        head = head_factory(str(job), "--hostfile", str(lab4.hostfile), "--master-port", str(port))
        assert head.finish(60) == 2, head.output()
        assert re.search(r"cdssh1 .*master port not free: " + re.escape(os.strerror(errno.EADDRINUSE)), "\n".join(head.stderr))
    finally:
        holder.kill()
        holder.wait()


def test_accept_new_host_keys_adds_them(lab4: SSHLab, head_factory) -> None:
    """accept_new_host_keys: unknown keys are written to known_hosts, the policy is logged, job runs."""
    known = lab4.root / "known_hosts_empty"
    config = lab4.write_ssh_config(lab4.root / "ssh_config_new", lab4.hosts, UserKnownHostsFile=str(known))
    job = write_job(lab4, "noop.py", nproc=1, ssh={"config_file": str(config), "accept_new_host_keys": True})
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish(60) == 0, head.output()
    assert any("host keys: accept-new" in line for line in head.stderr)
    assert sorted(line.split()[0] for line in known.read_text().splitlines()) == [h.ip for h in lab4.hosts]
    again = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert again.finish(60) == 0, again.output()
    assert len(known.read_text().splitlines()) == 4


def test_changed_host_key_refused_even_with_accept_new(lab4: SSHLab, head_factory) -> None:
    """A host whose key differs from known_hosts is refused as a possible man-in-the-middle."""
    lines = lab4.known_hosts.read_text().splitlines()
    swapped = [lines[0].split()[0] + " " + " ".join(lines[1].split()[1:])] + lines[1:]
    known = lab4.root / "known_hosts_swapped"
    known.write_text("\n".join(swapped) + "\n")
    config = lab4.write_ssh_config(lab4.root / "ssh_config_swapped", lab4.hosts, UserKnownHostsFile=str(known))
    job = write_job(lab4, "noop.py", nproc=1, ssh={"config_file": str(config), "accept_new_host_keys": True})
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish(60) == 2, head.output()
    changed = [line for line in head.stderr if "HOST KEY CHANGED" in line]
    assert len(changed) == 1 and changed[0].lstrip().startswith("cdssh1 "), head.output()
