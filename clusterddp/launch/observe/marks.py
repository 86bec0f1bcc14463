"""The launcher's own account of one attempt, for the sbatch script that started it.

srun exits 0 when no task launched (a SPANK plugin failing in the step: ``task 0 launch
failed: Plugin initialization failed``), so the batch script cannot tell from srun's status
whether a node ran a launcher at all. It hands every launcher ``--marks-dir DIR`` (one
directory per attempt); the launcher writes ``node<R>.started`` as soon as it knows its node
rank, and ``node<R>.exit`` with its exit status when it ends (clusterddp.protocol spells the
names). A node without ``.started`` never ran a launcher; ``.started`` without ``.exit`` is a
launcher that was killed.
"""

from __future__ import annotations

import os
import socket

from clusterddp import protocol
from clusterddp.atomicfile import WriteError
from clusterddp.earlystop import StoppedEarly
from clusterddp.errors import ClusterDDPError, LaunchError
from clusterddp.launch.observe.logs import say


class LaunchMarks:
    """This launcher's two records in ``directory`` (None: nobody asked, nothing is written)."""

    def __init__(self, directory: str | None, node_rank: int) -> None:
        self.directory = directory
        self.node_rank = node_rank

    def started(self) -> None:
        """Say "this node runs a launcher". A record that cannot be written is an error: the
        batch script would otherwise call this node one that never started."""
        if self.directory is None:
            return
        try:
            protocol.write_mark(self.directory, self.node_rank, protocol.MARK_STARTED,
                                  f"pid {os.getpid()} on {socket.gethostname()}\n")
        except WriteError as exc:
            raise LaunchError(f"--marks-dir: node {self.node_rank}: {exc}",
                              "the batch script's record directory must be writable on every node") from None

    def ended(self, code: int) -> None:
        """Leave the exit status; on failure say so and keep the launcher's own exit code
        (the script then reports a launcher that started and left no exit status)."""
        if self.directory is None:
            return
        try:
            protocol.write_mark(self.directory, self.node_rank, protocol.MARK_EXIT, f"{code}\n")
        except WriteError as exc:
            say(f"clusterddp: warning: --marks-dir: {exc}")


def exit_code_of(exc: BaseException) -> int:
    """The exit status the CLI gives for ``exc`` (clusterddp.cli.main), for the exit record."""
    if isinstance(exc, ClusterDDPError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, StoppedEarly):
        return 128 + exc.signum
    if isinstance(exc, SystemExit):
        return protocol.exit_status(exc.code)  # as CPython's main, as a worker's bootstrap
    return 1
