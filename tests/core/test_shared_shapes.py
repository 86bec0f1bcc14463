"""The helpers that replaced duplicated code: the fork with a pipe (reaper, zygote) and the
one parser of /proc/<pid>/stat (procid, teardown/procs), on real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clusterddp import procid
from clusterddp.launch.teardown.forking import fork_with_pipe


@pytest.mark.parametrize("child_writes", [True, False])
def test_fork_with_pipe_joins_parent_and_child_in_the_asked_direction(child_writes: bool) -> None:
    """The writer's bytes reach the reader, and the reader sees EOF once the writer is gone."""
    pid, fd = fork_with_pipe(child_writes)
    if pid == 0:  # the child: write, or read all; then leave without running pytest's cleanup
        code = 0
        try:
            if child_writes:
                os.write(fd, b"from the child")
            elif os.read(fd, 100) != b"from the parent" or os.read(fd, 1) != b"":
                code = 3
        except BaseException:  # noqa: BLE001 (never back into pytest in a forked child)
            code = 4
        os._exit(code)
    try:
        if child_writes:
            received = b""
            while chunk := os.read(fd, 100):
                received += chunk
            assert received == b"from the child"
        else:
            os.write(fd, b"from the parent")
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_proc_stat_reads_a_name_with_spaces_and_parentheses() -> None:
    """A process whose name holds ") (" is read right: its parent, group, state and the start
    time ``procid.start_time`` gives."""
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nopen('/proc/self/comm', 'w').write('a) (b c')\n"
                              "print('named', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "named\n"
        stat = procid.proc_stat(child.pid)
        assert stat is not None
        assert (stat.ppid, stat.pgrp, stat.state in "RS") == (os.getpid(), os.getpgrp(), True)
        assert stat.start_time == procid.start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    assert procid.proc_stat(child.pid) is None
