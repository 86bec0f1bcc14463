"""The one rule each for workers per node, the default run id, the master port and loopback,
shared by this node's resolve and the SSH fan-out; and the choice between fan-out and local."""

from __future__ import annotations

import pytest

from clusterddp.launch.options import RunOptions, wants_fanout
from clusterddp.sections.ssh import SSHSpec
from clusterddp.spec import JobSpec
from clusterddp.topology import (CPU_AUTO_WORKERS, choose_port, count_workers, default_run_id, derive_port,
                                 is_loopback)


@pytest.mark.parametrize("request_,gpus,cpus,scheduled,expected", [
    (3, 8, 16, None, (3, "nproc_per_node")),
    ("cpu", 8, 16, 4, (16, "CPU cores")),
    ("gpu", 0, 16, 4, (0, "visible GPUs")),
    ("gpu", 2, 16, None, (2, "visible GPUs")),
    ("gpu", 2, 16, 1, (1, "the scheduler's count")),
    ("auto", 4, 16, None, (4, "visible GPUs")),
    ("auto", 0, 16, 3, (3, "the scheduler's count")),
    ("auto", 0, 16, None, (CPU_AUTO_WORKERS, "auto without a GPU")),
])
def test_count_workers(request_, gpus, cpus, scheduled, expected) -> None:  # type: ignore[no-untyped-def]
    """nproc_per_node: a number, one per core, the scheduler's count, one per GPU, else 2."""
    assert count_workers(request_, gpus, cpus, scheduled) == expected


@pytest.mark.parametrize("addr,expected", [
    ("localhost", True), ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True),
    ("10.0.0.5", False), ("node1", False), (None, False),
])
def test_is_loopback(addr: str | None, expected: bool) -> None:
    """Only addresses this machine alone can reach count as loopback."""
    assert is_loopback(addr) is expected


def test_default_run_id_and_port() -> None:
    """Several nodes agree on the job name as run id; one node gets a unique id; the port is
    the first given, else derived from the run id (or free on one machine)."""
    assert default_run_id("job", nnodes=4) == "job"
    assert default_run_id("job").startswith("job-") and default_run_id("x" * 200).startswith("x" * 96 + "-")
    assert choose_port("r", None, 29500, 29501) == 29500
    assert choose_port("r", None, None) == derive_port("r")
    assert 0 < choose_port("r", here=True) < 65536


def test_wants_fanout() -> None:
    """A hostfile fans out; job hosts fan out unless a flag places this node; a remote launcher never does."""
    plain, hosts = JobSpec(script="x.py"), JobSpec(script="x.py", ssh=SSHSpec(hosts=("a", "b")))
    assert wants_fanout(plain, RunOptions(hostfile="h.txt"))
    assert not wants_fanout(plain, RunOptions())
    assert wants_fanout(hosts, RunOptions())
    assert not wants_fanout(hosts, RunOptions(master_addr="10.0.0.1"))
    assert not wants_fanout(plain, RunOptions(hostfile="h.txt", watch_stdin=True))
    assert not wants_fanout(plain, RunOptions(hostfile="h.txt", node_rank=1))


def test_cli_parses_scheduler_flags_into_options() -> None:
    """'submit openpai JOB --url U --dry-run' and 'render slurm JOB -o F' become typed options."""
    from clusterddp.cli import scheduler_options
    from clusterddp.schedulers.openpai.scheduler import OpenPAIOptions
    from clusterddp.schedulers.slurm import SlurmOptions

    assert scheduler_options("submit", "openpai", ["j.yaml", "--url", "https://pai", "--dry-run"]) == OpenPAIOptions(
        "submit", job="j.yaml", url="https://pai", dry_run=True)
    assert scheduler_options("render", "slurm", ["j.yaml", "-o", "f"]) == SlurmOptions("render", job="j.yaml", output="f")
