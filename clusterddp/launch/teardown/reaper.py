"""The reaper: a forked guard that kills the job when the launcher dies, and its replacement.

The reaper holds the read end of a pipe from the launcher and, when it reads EOF without the
all-clear (the launcher is gone, however it died, ``kill -9`` included), SIGKILLs every worker
process group and adopted orphan it was told about, the processes carrying the launcher's
marker, the job's cgroup and the zygote's (``c<path>``, zygotetree.py). It is the one layer
that acts after a ``kill -9``; without it a worker's children (a DataLoader worker, a
``setsid`` daemon) outlive the launcher.

A reaper can itself be lost: a stray ``kill``/``pkill -9``, the OOM killer, a ``SIGSTOP``.
It is the launcher's child, so the kernel tells the launcher at once (SIGCHLD, which wakes the
supervisor's loop; a stop too, since the handler is installed without SA_NOCLDSTOP), and
``Reaper.check`` then replaces it: a stopped one is SIGKILLed first, the new one is told
every group and pid the old one knew, and the job runs on. A training run must not die of a
stray signal to a helper process. Replacement is bounded: the reaper lost more than
``REPLACEMENTS`` times within ``WINDOW`` seconds, or a fork that fails, means something keeps
taking it away, and the job is stopped with that cause rather than run unguarded.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from typing import IO

from clusterddp.launch.teardown import cgroup as cgroups
from clusterddp.launch.teardown import procs
from clusterddp.launch.teardown.forking import fork_with_pipe

#: A reaper lost this many times within WINDOW seconds is replaced each time; once more stops the job.
REPLACEMENTS = 3
#: Seconds over which the losses are counted (a loss a day in a week-long run is no pattern).
WINDOW = 60.0

#: The launcher's last line to the reaper on a normal end: nothing to kill by pid (those pids
#: are reaped and may be reused by now); only the marker and the cgroup are checked.
_ALL_CLEAR = b"done"

#: Signals the reaper ignores: a Ctrl-C or a scheduler's SIGTERM is for the launcher, which
#: then tears down and gives the all-clear.
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@dataclass(frozen=True)
class ReaperLoss:
    """A reaper that died or was stopped, and what the launcher did about it."""

    pid: int
    #: "was killed by SIGKILL", "exited with 1", "was stopped by SIGSTOP".
    how: str
    #: The new reaper's pid; None when none could be started (``cause`` says why).
    replaced_by: int | None
    #: Why the job must stop (one line for the report); None when a new reaper runs.
    cause: str | None

    def line(self) -> str:
        """What the console is told of a replacement (a cause goes to the report)."""
        return (f"clusterddp: warning: the reaper (pid {self.pid}) {self.how}; started a new one "
                f"(pid {self.replaced_by}); at most {REPLACEMENTS} replacements within {WINDOW:.0f} s")


class Reaper:
    """The launcher's side of the reaper: what to watch, a check that replaces a lost one, the
    all-clear at a normal end."""

    def __init__(self, token: str, cgroup_dir: str | None = None) -> None:
        self._token = token
        self._cgroup_dir = cgroup_dir
        #: Every line sent, for a replacement to learn what the lost reaper knew.
        self._sent: list[str] = []
        #: monotonic times of the losses within the last WINDOW seconds.
        self._losses: list[float] = []
        self._pipe: IO[str] | None
        self.pid, self._pipe = _start(token, cgroup_dir)
        #: Set once a lost reaper could not be replaced: the job runs without one.
        self.gone: str | None = None

    def watch(self, pgid: int) -> None:
        """Tell the reaper about a worker's process group."""
        self._send(f"{pgid}\n")

    def watch_pid(self, pid: int) -> None:
        """Tell the reaper about one process (an orphan adopted by the launcher)."""
        self._send(f"p{pid}\n")

    def watch_cgroup(self, path: str) -> None:
        """Tell the reaper about a cgroup besides the job's (the zygote's, zygotetree.py)."""
        self._send(f"c{path}\n")

    def _send(self, line: str) -> None:
        self._sent.append(line)
        _write(self._pipe, line)

    def check(self) -> ReaperLoss | None:
        """Replace the reaper if it died or was stopped since the last check (None: it runs).

        Called on every wake-up of the supervisor's loop and during teardown: it costs one
        ``waitpid(pid, WNOHANG)``. Only this pid is waited for, so nothing else's exit
        status is taken, and the orphan collector never counts a reaper as an orphan.
        """
        if self.gone is not None:
            return None
        how = _lost(self.pid)
        if how is None:
            return None
        lost, now = self.pid, time.monotonic()
        self._losses = [t for t in self._losses if now - t < WINDOW] + [now]
        _close(self._pipe)
        self._pipe = None
        if len(self._losses) > REPLACEMENTS:
            self.gone = (f"the reaper (pid {lost}) {how}, lost {len(self._losses)} times within "
                         f"{WINDOW:.0f} s: without it a kill -9 of the launcher would leave the "
                         "workers' children running")
            return ReaperLoss(lost, how, None, self.gone)
        try:
            self.pid, self._pipe = _start(self._token, self._cgroup_dir)
        except OSError as exc:
            self.gone = (f"the reaper (pid {lost}) {how}, and a new one could not be started "
                         f"({exc.strerror or exc})")
            return ReaperLoss(lost, how, None, self.gone)
        for line in self._sent:
            _write(self._pipe, line)
        return ReaperLoss(lost, how, self.pid, None)

    def close(self) -> None:
        """Normal end: everything is already dead; let the reaper check once more and exit."""
        if self._pipe is None:
            return
        _write(self._pipe, _ALL_CLEAR.decode() + "\n")
        _close(self._pipe)
        self._pipe = None
        while True:
            try:
                _pid, status = os.waitpid(self.pid, os.WUNTRACED)
            except ChildProcessError:
                return
            if not os.WIFSTOPPED(status):
                return
            procs.kill_pids([self.pid])  # stopped: teardown did its work already; never hang here


def _start(token: str, cgroup_dir: str | None) -> tuple[int, IO[str]]:
    """Fork a reaper; its pid and the launcher's end of its pipe."""
    pid, pipe = fork_with_pipe(child_writes=False)
    if pid == 0:  # the reaper, reading what the launcher writes
        _reaper_main(pipe, token, cgroup_dir)
    os.set_inheritable(pipe, False)
    return pid, os.fdopen(pipe, "w", buffering=1)


def _lost(pid: int) -> str | None:
    """How the reaper ``pid`` was lost, or None while it runs. A stopped one is SIGKILLed and
    collected here: it could not act on the launcher's death until someone resumed it."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
    except ChildProcessError:
        return "is gone"
    if done != pid:
        return None
    if os.WIFSTOPPED(status):
        procs.kill_pids([pid])
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        return f"was stopped by {_signal_name(os.WSTOPSIG(status))}"
    if os.WIFSIGNALED(status):
        return f"was killed by {_signal_name(os.WTERMSIG(status))}"
    return f"exited with {os.WEXITSTATUS(status)}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _write(pipe: IO[str] | None, line: str) -> None:
    """A line to the reaper; a lost one (EPIPE) is noticed by ``check``, not here."""
    if pipe is None:
        return
    try:
        pipe.write(line)
    except (OSError, ValueError):
        pass


def _close(pipe: IO[str] | None) -> None:
    if pipe is None:
        return
    try:
        pipe.close()
    except (OSError, ValueError):
        pass


def _reaper_main(read_end: int, token: str, cgroup_dir: str | None) -> None:
    """Body of the reaper process: read pgids until EOF, then kill them all. Never returns."""
    try:
        os.setsid()  # out of the terminal's process group: Ctrl-C is for the launcher
        for sig in _IGNORED:
            signal.signal(sig, signal.SIG_IGN)
        for sig in signal.valid_signals():  # a replacement is forked from a running launcher:
            if callable(signal.getsignal(sig)):  # drop its Python handlers (SIGCHLD, stacks)
                signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # do not hold the launcher's console/pipes open after it exits
            os.dup2(devnull, fd)
        os.closerange(3, read_end)  # also the workers' pipes and the launcher's other fds
        os.closerange(read_end + 1, 1024)
        lines = _read_until_eof(read_end)
        if _ALL_CLEAR not in lines:
            for line in lines:
                if line.startswith(b"p") and line[1:].isdigit():
                    procs.kill_pids([int(line[1:])])
                elif line.isdigit():
                    procs.signal_group(int(line), signal.SIGKILL)
        dirs = [cgroup_dir] if cgroup_dir else []
        dirs += _other_cgroups(lines)
        for path in dirs:
            cgroups.kill(path)
        procs.kill_marked(token)
        for path in dirs:
            cgroups.remove(path, time.monotonic() + 5.0)
    finally:
        os._exit(0)


def _other_cgroups(lines: set[bytes]) -> list[str]:
    """The cgroups besides the job's it was told (``c<path>``): only job cgroups, by name."""
    paths = [os.fsdecode(line[1:]) for line in lines if line.startswith(b"c")]
    return [p for p in paths if os.path.basename(p).startswith(cgroups.PREFIX)]


def _read_until_eof(fd: int) -> set[bytes]:
    lines: set[bytes] = set()
    buffer = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            break
        if not chunk:
            break
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        lines.update(line.strip() for line in complete if line.strip())
    return lines
