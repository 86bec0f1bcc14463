"""SSH fan-out against real sshd hosts (network namespaces): runs, failures, teardown, security."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.ssh.conftest import REPO, write_job
from tests.testbed import SSHLab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _assert_clean(lab: SSHLab, within: float) -> float:
    clean, seconds, left = lab.wait_clean(within)
    assert clean, f"processes left after {within}s: {_described(left)}"
    return seconds


def _described(left: dict[str, list[int]]) -> dict[str, list[str]]:
    """Each leftover pid with its state and command line, so a failure says what was stuck."""
    out: dict[str, list[str]] = {}
    for host, pids in left.items():
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                wchan = Path(f"/proc/{pid}/wchan").read_text()
            except OSError:
                state, cmd, wchan = "?", "(gone)", ""
            out.setdefault(host, []).append(f"{pid} {state} {wchan} {cmd[:160]}")
    return out


def test_hello_4_hosts_x_2_workers(lab4: SSHLab, head_factory, tmp_path: Path) -> None:
    """jobs/hello.py on 4 hosts x 2 workers: gloo across hosts, ranks 0-7 each on the right host."""
    job = write_job(lab4, str(REPO / "jobs" / "hello.py"), name="hello")
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish() == 0, head.output()
    hosts_by_rank = {}
    for line in head.stdout:
        match = re.search(r"hello from rank (\d+)/8 .* on (cdssh\d+)", line)
        if match:
            hosts_by_rank[int(match.group(1))] = match.group(2)
    assert hosts_by_rank == {r: f"cdssh{r // 2 + 1}" for r in range(8)}, head.output()
    _assert_clean(lab4, 3)
    copies = sorted(tmp_path.glob("logs/*/ssh-cdssh*.log"))
    assert [c.name for c in copies] == [f"ssh-cdssh{k}.log" for k in range(1, 5)]
    assert "hello from rank 7/8" in copies[3].read_text()


def test_cifar10_few_steps_on_4_hosts(lab4: SSHLab, head_factory, tmp_path: Path) -> None:
    """jobs/cifar10.py over SSH, 4 hosts x 2 workers, a few steps: trains, checkpoints, leaves nothing."""
    args = ["--epochs", "1", "--width", "4", "--batch-size", "8", "--synthetic-train", "256",
            "--synthetic-test", "64", "--workers", "0", "--out-dir", str(tmp_path / "run")]
    job = write_job(lab4, str(REPO / "jobs" / "cifar10.py"), name="cifar", args=args)
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish() == 0, head.output()
    out = "\n".join(head.stdout)
    assert "8 rank(s)" in out and "epoch 1/1" in out, head.output()
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()
    _assert_clean(lab4, 3)


def test_worker_failure_on_host3_stops_every_host(lab4: SSHLab, head_factory) -> None:
    """A worker exiting 3 on host 3: every host clean (how soon: printed, benchmarks/ssh_fanout.py); exit code 3; root cause names cdssh3."""
    job = write_job(lab4, "fail_on_host.py", env={"FAIL_HOST": "cdssh3", "FAIL_CODE": "3", "FAIL_AFTER": "2"})
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    failed_line = head.wait_for(r"FAILING at", timeout=60)[0]
    failed_at = float(failed_line.rsplit(" ", 1)[1])
    _assert_clean(lab4, 10)
    cleaned_after = time.time() - failed_at
    code = head.finish()
    print(f"worker failure on cdssh3 -> every host clean after {cleaned_after:.2f}s")  # a figure, not a test
    assert code == 3, head.output()
    stderr = "\n".join(head.stderr)
    assert "failed on cdssh3" in stderr and "rank 4" in stderr, head.output()
    assert re.search(r"host: +cdssh3 \(10\.78\.0\.4\), node rank 2", stderr), head.output()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_head_signal_stops_every_host(lab4: SSHLab, head_factory, signum: int) -> None:
    """Each stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT, as on one node) to the head: every host
    clean, exit code 128+signal."""
    job = write_job(lab4, "wait_forever.py")
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    head.wait_for(r"ready rank", count=8)
    sent = time.monotonic()
    head.signal(signum)
    _assert_clean(lab4, 10)
    seconds = time.monotonic() - sent
    code = head.finish(30)
    print(f"{signal.Signals(signum).name} to the head -> every host clean after {seconds:.2f}s")  # a figure
    assert code == 128 + signum, head.output()


def test_ctrl_c_on_the_head_reaches_every_rank_as_keyboard_interrupt(lab4: SSHLab, head_factory,
                                                                     tmp_path: Path) -> None:
    """SIGINT to the head: every rank on every host runs its except KeyboardInterrupt; exit 130, nothing left."""
    out = tmp_path / "interrupted"
    out.mkdir()
    job = write_job(lab4, str(REPO / "tests" / "bin" / "keyboard_interrupt.py"), args=[str(out)])
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    head.wait_for(r"ready rank", count=8)
    head.signal(signal.SIGINT)
    _assert_clean(lab4, 10)
    code = head.finish(30)
    ran = sorted(p.name for p in out.glob("rank*.interrupted"))
    print(f"SIGINT to the head: {len(ran)} of 8 ranks ran except KeyboardInterrupt, exit {code}")
    assert ran == [f"rank{r}.interrupted" for r in range(8)], head.output()
    assert code == 128 + signal.SIGINT, head.output()


def test_head_kill9_remote_workers_gone(lab4: SSHLab, head_factory) -> None:
    """kill -9 of the head: the hosts see their sessions end and stop."""
    job = write_job(lab4, "wait_forever.py")
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    head.wait_for(r"ready rank", count=8)
    sent = time.monotonic()
    head.kill()
    _assert_clean(lab4, 10)
    seconds = time.monotonic() - sent
    print(f"kill -9 of the head -> every host clean after {seconds:.2f}s")  # a figure, not a test


def test_link_cut_stops_everywhere_naming_host(lab4: SSHLab, head_factory) -> None:
    """Host 3's link goes down mid-run: all hosts (host 3 too) stop; cdssh3 is named."""
    job = write_job(lab4, "wait_forever.py")
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    head.wait_for(r"ready rank", count=8)
    cut = time.monotonic()
    lab4.cut(lab4.host("cdssh3"))
    code = head.finish(30)
    head_seconds = time.monotonic() - cut
    clean_seconds = _assert_clean(lab4, 15) + head_seconds
    print(f"link cut -> head done after {head_seconds:.2f}s, every host clean after {clean_seconds:.2f}s")  # figures
    assert code == 255, head.output()
    assert re.search(r"failed on cdssh3: connection lost", "\n".join(head.stderr)), head.output()


def test_unknown_host_key_refused(lab4: SSHLab, head_factory) -> None:
    """A host missing from known_hosts is refused with a line naming it; nothing starts anywhere."""
    known = lab4.root / "known_hosts_without_2"
    known.write_text("".join(line + "\n" for line in lab4.known_hosts.read_text().splitlines()
                             if not line.startswith("cdssh2,")))
    config = lab4.write_ssh_config(lab4.root / "ssh_config_k", lab4.hosts, UserKnownHostsFile=str(known))
    job = write_job(lab4, "wait_forever.py", ssh={"config_file": str(config)})
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish(60) == 2, head.output()
    refused = [line for line in head.stderr if "host key refused" in line]
    assert len(refused) == 1 and refused[0].lstrip().startswith("cdssh2 "), head.output()
    assert "nothing was started" in "\n".join(head.stderr)
    assert not head.stdout, head.output()
    _assert_clean(lab4, 2)


def test_unreachable_host_named_by_preflight(lab4: SSHLab, head_factory) -> None:
    """One host down, another without sshd: preflight names both at once and nothing starts."""
    lab4.cut(lab4.host("cdssh4"))
    lab4.stop_sshd(lab4.host("cdssh2"))
    job = write_job(lab4, "wait_forever.py")
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish(60) == 2, head.output()
    stderr = "\n".join(head.stderr)
    assert "preflight failed on 2 of 4 hosts" in stderr, head.output()
    assert re.search(r"cdssh2 .*connection refused", stderr), head.output()
    assert re.search(r"cdssh4 .*(no answer|unreachable)", stderr), head.output()
    assert not head.stdout, head.output()
    _assert_clean(lab4, 2)


TRICKY = ["it's", 'say "hi"', "$(id)", "`id`", "a b  c", "line1\nline2", "; rm -rf /tmp/nope", "\\", "*",
          "--nnodes", "$HOME", "-"]


def test_arguments_and_env_reach_workers_byte_for_byte(lab4: SSHLab, head_factory, tmp_path: Path) -> None:
    """Quotes, $(id), backticks, spaces and newlines in args and env reach every worker unchanged."""
    out = tmp_path / "argv"
    out.mkdir()
    job = write_job(lab4, "write_argv.py", nproc=1, args=TRICKY,
                    env={"OUT_DIR": str(out), "TRICKY": "\n".join(TRICKY)})
    head = head_factory(str(job), "--hostfile", str(lab4.hostfile))
    assert head.finish() == 0, head.output()
    for rank in range(4):
        data = json.loads((out / f"rank{rank}.json").read_text())
        assert data == {"argv": TRICKY, "tricky": "\n".join(TRICKY)}


def test_command_after_dashes_reaches_workers_byte_for_byte(lab4: SSHLab, head_factory, tmp_path: Path) -> None:
    """Without a job file (clusterddp run --hostfile H -- script args) the args arrive unchanged too."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(lab4.ssh_config.read_text())
    head = head_factory("--hostfile", str(lab4.hostfile), "--nproc-per-node", "1", "--",
                        str(REPO / "tests" / "ssh" / "bin" / "write_argv.py"), *TRICKY,
                        env={"HOME": str(home)})
    assert head.finish() == 0, head.output()
    for rank in range(4):  # no job env: the worker writes to its cwd, the head's directory
        assert json.loads((tmp_path / f"rank{rank}.json").read_text())["argv"] == TRICKY
