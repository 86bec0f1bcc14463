"""The launcher's side of the warm interpreter (``zygote.py``): start it, wait for it, ask
it for workers, and fall back to a cold start, with one line, whenever it cannot serve.

Why: every cold worker imports torch again (1-2 s of CPU each, all at once on a node with 8
workers), and so does every restart. The zygote imports it once per node and forks each
worker of every attempt with that attempt's environment (``WorkerEnv.build``, unchanged).

How a forked worker stays a worker the supervisor knows (docs/warm-start.md):

- it is the launcher's child (a double fork, the launcher a child subreaper), so the group
  waits for it by pid as for a cold one: ``ForkedProcess`` is the ``Popen`` of such a child;
- its stdio are pipes the launcher makes here and passes over the socket (SCM_RIGHTS); the
  launcher keeps the read ends for ``WorkerOutput``, as a cold worker's ``Popen`` pipes;
- it runs the script only after a byte on its *go* pipe, written here once the zygote's
  reply gave its pid (``Zygote.answer``); a worker whose reply never came (the zygote died or
  stopped in between) sees the pipe closed unwritten and exits without running anything, and
  its rank starts cold: no rank runs twice, no forked worker runs unsupervised;
- the zygote lives outside the job's cgroup (a teardown kills the cgroup), in one of its own
  where one can be made, and without the launcher's marker (a teardown kills marked
  processes); it dies with the launcher (PDEATHSIG), the reaper knows its group and cgroup,
  and its close ends what its preloads started (zygotetree.py).

When to use it (``warm_start:``): ``auto`` when the entry script imports torch itself (it
would pay the import anyway, so waiting for the zygote is never slower than a cold start) or
the job names ``preload:``; ``true`` always; ``false`` never.
"""

from __future__ import annotations

import ast
import os
import select
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from clusterddp import protocol
from clusterddp.launch.teardown import procs
from clusterddp.launch.teardown.zygotetree import ZygoteTree
from clusterddp.protocol import SUPERVISOR_ID_ENV

if TYPE_CHECKING:
    from clusterddp.launch.teardown.cgroup import JobCgroup

#: Longest wait for the zygote's import of torch and the preloads before a cold start.
READY_TIMEOUT = 120.0
#: Longest wait for one fork (the zygote answers in milliseconds when healthy).
FORK_TIMEOUT = 10.0
ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")


#: How a zygote was started: interpreter, environment (sorted items), preloads.
_Key = tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]]


class ZygoteLost(Exception):
    """The zygote cannot serve (died, stopped, refused): the message is the one line said."""


@dataclass
class ForkedProcess:
    """A worker forked by the zygote and reparented to the launcher: what ``WorkerGroup``
    uses of ``subprocess.Popen``, on a pid that is the launcher's child."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (``-N`` for signal N, as Popen), or None while it runs."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: no status left to read
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        assert self.returncode is not None
        return self.returncode


def wanted(mode: bool | str, entry: Sequence[str], cwd: str, preload: Sequence[str]) -> bool:
    """``warm_start:`` applied: ``auto`` is on when ``preload:`` is given or the entry (the
    script, or ``-m``'s module file found under ``cwd``) imports torch itself."""
    if mode is True or mode is False:
        return mode
    if preload:
        return True
    return imports_torch(entry_file(entry, cwd))


def entry_file(entry: Sequence[str], cwd: str) -> str | None:
    """The file a worker runs: ``SCRIPT`` (relative to cwd), or ``-m`` MODULE's file under
    cwd (``pkg/mod.py`` or ``pkg/mod/__main__.py``); None when not found without importing."""
    if not entry:
        return None
    if entry[0] != "-m":
        return os.path.join(cwd, entry[0])
    if len(entry) < 2:
        return None
    base = os.path.join(cwd, *entry[1].split("."))
    for path in (base + ".py", os.path.join(base, "__main__.py")):
        if os.path.isfile(path):
            return path
    return None


def imports_torch(path: str | None) -> bool:
    """True when the file has an ``import torch...`` or ``from torch... import`` anywhere."""
    if path is None:
        return False
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(2_000_000), path)
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
            return True
    return False


@dataclass
class Zygote:
    """One running zygote and the launcher's end of its socket."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    #: What it was started with (interpreter, environment, preloads): a zygote started early
    #: (``prestart``) serves a group only if the group would have started the same one.
    started_with: "_Key"
    #: Said once when it stops serving (None: serving, or still warming up).
    lost: str | None = None
    ready: bool = False
    #: Seconds it took to import torch and the preloads.
    warm_seconds: float | None = None
    #: Its cgroup, if any, and what its teardown reaches beyond its process group.
    tree: ZygoteTree = field(default_factory=lambda: ZygoteTree(None))
    _prefix: tuple[str, ...] = field(default=())

    @classmethod
    def start(cls, python: str, bootstrap_cmd: Sequence[str], env: Mapping[str, str],
              preload: Sequence[str], log: str | None) -> "Zygote":
        """Start it (its own session, killed with the launcher, outside the job's cgroup);
        raise ZygoteLost when it cannot be started."""
        command = zygote_command()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            out = open(log, "ab") if log else subprocess.DEVNULL
        except OSError:
            out = subprocess.DEVNULL
        tree = ZygoteTree.open()  # what its teardown reaches (zygotetree.py)
        try:
            proc = procs.spawn([python, *command, str(theirs.fileno()), *preload], env, os.getcwd(),
                               cgroup=tree.cgroup, pass_fds=(theirs.fileno(),), output=out)
        except OSError as exc:
            ours.close()
            tree.kill([])
            raise ZygoteLost(f"cannot start it: {exc.strerror or exc}") from None
        finally:
            theirs.close()
            if not isinstance(out, int):
                out.close()
        return cls(proc, ours, started_with=_key(python, env, preload), tree=tree,
                   _prefix=(python, *bootstrap_cmd))

    def wait_ready(self, stopping: Callable[[], bool], timeout: float = READY_TIMEOUT) -> None:
        """Until it has imported torch and the preloads; ZygoteLost saying why it cannot serve
        (unsafe to fork, an import failed, it died, it took too long)."""
        if self.ready:
            return
        if self.lost:
            raise ZygoteLost(self.lost)
        deadline = time.monotonic() + timeout
        while not self._readable(0.05):
            if stopping():
                self._lose("the launcher is stopping")
            if time.monotonic() >= deadline:
                self._lose(f"it was not ready after {timeout:.0f} s")
        message = self._receive("while importing torch")
        if not message.get("ready"):
            self._lose(str(message.get("why") or "it refused"))
        self.ready = True
        self.warm_seconds = float(message.get("seconds") or 0.0)

    def request(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, cpus: tuple[int, ...] | None,
                cgroup: str | None, batch: int = 1) -> tuple[int, int, int]:
        """Ask for a worker without waiting for it (``answer`` gets it, requests answered in
        order): the read ends of its stdout and stderr, and the write end of its go pipe (the
        worker runs nothing before a byte on it, and exits at its EOF: zygote.become_worker;
        only the launcher holds this end). ``batch``: how many requests are sent
        back to back, this one the first of them (the zygote waits for all before it forks,
        and shares them out over a few intermediates: zygote.serve)."""
        if tuple(argv[:len(self._prefix)]) != self._prefix:
            raise ZygoteLost("the worker's command is not the bootstrap's")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        go_r, go_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        request = {"argv": list(argv), "env": dict(env), "cwd": cwd, "cpus": list(cpus) if cpus else None,
                   "cgroup": cgroup, "launcher": os.getpid(), "batch": batch}
        try:
            protocol.send_frame(self.sock, request, [null, out_w, err_w, go_r])
        except OSError as exc:
            _close((out_r, err_r, go_w))
            self._lose(f"it {self._how_gone()} before a fork" if self._exited()
                       else f"its socket failed: {exc.strerror or exc}")
        finally:
            for fd in (null, out_w, err_w, go_r):
                os.close(fd)
        return out_r, err_r, go_w

    def answer(self, pipes: tuple[int, int, int]) -> ForkedProcess:
        """The worker of the oldest request not answered yet (``pipes``: what ``request``
        returned for it), told to go; ZygoteLost when the zygote cannot (the caller closes the
        pipes: a worker forked meanwhile then exits without running the script)."""
        if not self._readable(FORK_TIMEOUT):
            self._lose(f"no answer to a fork within {FORK_TIMEOUT:.0f} s")
        reply = self._receive("while forking a worker")
        if "pid" not in reply:
            self._lose(f"fork failed: {reply.get('error')}")
        out_r, err_r, go_w = pipes
        forked = ForkedProcess(int(reply["pid"]), os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
        try:
            os.write(go_w, b"g")  # its pid is ours now: it may run the script
        except OSError:
            pass  # it died already: waitpid says how, as for any worker
        finally:
            os.close(go_w)
        return forked

    def close(self) -> None:
        """Stop it: EOF on its socket ends it; SIGKILL in case it is stopped or busy; then
        what it started (a preload's processes: its tree and cgroup, zygotetree.py)."""
        tree = self.tree.snapshot(self.proc.pid)  # before the EOF: once it exits, its children leave its tree
        self.sock.close()
        procs.signal_group(self.proc.pid, signal.SIGKILL)
        self.tree.kill(tree)
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass

    def _readable(self, timeout: float) -> bool:
        try:
            ready, _, _ = select.select([self.sock], [], [], timeout)
        except (OSError, ValueError):
            return True  # a closed socket: the receive says so
        return bool(ready)

    def _receive(self, doing: str) -> dict[str, Any]:
        try:
            message, _fds = protocol.receive_frame(self.sock)
        except ConnectionResetError:  # it died with our request unread (a loaded machine): as EOF
            message = None
        except (OSError, ValueError) as exc:
            self._lose(f"its socket failed {doing}: {exc}")
        if message is None:
            self._exited()  # EOF: it is on its way out, its status says how
            self._lose(f"it {self._how_gone()} {doing}")
        assert message is not None
        return message

    def _exited(self) -> bool:
        """True once it has exited (a broken socket: it is on its way out, give it a second)."""
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _how_gone(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "closed its socket"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with {code}"

    def _lose(self, why: str) -> None:
        """Stop serving for good: the zygote is stopped, the line kept, ZygoteLost raised."""
        self.lost = why
        self.close()
        raise ZygoteLost(why)


class _Plan(Protocol):
    """What a worker's plan (workers.WorkerPlan) says of how to start it."""

    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def cwd(self) -> str: ...
    @property
    def cpus(self) -> tuple[int, ...] | None: ...
    @property
    def log(self) -> str: ...


@dataclass
class WarmStart:
    """A worker group's zygote across attempts: started at the first worker, used while it
    serves; after the first problem every worker starts cold, and one line says why."""

    preload: tuple[str, ...]
    say: Callable[[str], None]
    #: True once the supervisor is stopping: no point waiting for the zygote then.
    stopping: Callable[[], bool]
    zygote: Zygote | None = None
    off: bool = False

    def spawn_all(self, workers: Sequence[tuple["_Plan", Mapping[str, str]]], cgroup: "JobCgroup | None",
                  started: Callable[[int, str | None], None]) -> list[ForkedProcess | None]:
        """Each (plan, env) forked, in order; None for those to start cold (the zygote is
        off, said once). All requests go out before the first answer is awaited: the zygote
        forks them back to back instead of waiting for the launcher between two workers."""
        forked: list[ForkedProcess | None] = [None] * len(workers)
        if self.off or not workers:
            return forked
        asked: list[tuple[int, int, int]] = []
        answered = 0
        try:
            zygote = self._ready(workers[0][0], workers[0][1], started)
            for plan, env in workers:
                asked.append(zygote.request(plan.argv, env, plan.cwd, plan.cpus, cgroup.path if cgroup else None,
                                            batch=len(workers) if not asked else 1))
            for pipes in asked:
                forked[answered] = zygote.answer(pipes)
                answered += 1
        except ZygoteLost as exc:
            self._turn_off(exc)
        finally:
            for pipes in asked[answered:]:  # never to be answered: a worker forked for one
                _close(pipes)  # sees its go pipe closed and exits without running anything
        return forked

    def _ready(self, plan: "_Plan", env: Mapping[str, str], started: Callable[[int, str | None], None]) -> Zygote:
        """The zygote, started at the first worker (with its environment) or taken from
        ``prestart`` when that one was started the same way, and warmed up."""
        if self.zygote is None:
            zygote_env = zygote_environment(env)
            self.zygote = take_prestarted(plan.argv[0], zygote_env, self.preload) \
                or Zygote.start(plan.argv[0], _bootstrap_command(), zygote_env, self.preload, zygote_log(plan.log, env))
            started(self.zygote.proc.pid, self.zygote.tree.cgroup_path)
        self.zygote.wait_ready(self.stopping)
        return self.zygote

    def _turn_off(self, exc: ZygoteLost) -> None:
        """Cold from now on, said in one line (not while stopping: no point then)."""
        self.off = True
        if not self.stopping():
            self.say(f"clusterddp: warm start off ({exc}): starting workers cold")

    def pid(self) -> int | None:
        return self.zygote.proc.pid if self.zygote is not None and not self.off else None

    def close(self) -> None:
        if self.zygote is not None and self.zygote.lost is None:
            self.zygote.close()


def zygote_environment(worker_env: Mapping[str, str]) -> dict[str, str]:
    """The zygote's environment: its first worker's, without the marker (a teardown kills
    marked processes, and the zygote must outlive the attempt)."""
    return {k: v for k, v in worker_env.items() if k != SUPERVISOR_ID_ENV}


def zygote_log(worker_log: str, worker_env: Mapping[str, str]) -> str:
    """``zygote.node<K>.log`` beside the workers' logs."""
    return os.path.join(os.path.dirname(worker_log), protocol.zygote_log_name(worker_env.get('GROUP_RANK', '0')))


#: The zygote ``prestart`` started, until a group takes it (``take_prestarted``) or it is dropped.
_prestarted: list[Zygote] = []


def prestart(python: str, env: Mapping[str, str], preload: Sequence[str], log: str) -> None:
    """Start the zygote now, ahead of the worker group: its ``import torch`` (the long part
    of a cold start) then runs while the launcher imports and sets up the rest of itself
    (the supervisor, the reaper, the cgroup), instead of after it. ``env``: the first
    worker's environment as the group will build it, ``zygote_environment`` applied; the
    group takes this zygote only if it would start the same one. Nothing is said when it
    cannot start: the group tries again, and says why if it fails too."""
    drop_prestarted()
    try:
        _prestarted.append(Zygote.start(python, _bootstrap_command(), env, preload, log))
    except ZygoteLost:
        pass


def take_prestarted(python: str, env: Mapping[str, str], preload: Sequence[str]) -> Zygote | None:
    """The prestarted zygote if it was started with this interpreter, environment and
    preloads (then it is the caller's); else None, and a mismatched one is stopped."""
    if not _prestarted:
        return None
    zygote = _prestarted.pop()
    if zygote.started_with == _key(python, env, preload):
        return zygote
    zygote.close()
    return None


def prestart_for(python: str, first_env: Mapping[str, str], preload: Sequence[str], first_log: str) -> None:
    """``prestart`` with what the worker group would start the zygote with: its first
    worker's environment for the first attempt (``zygote_environment``), its log beside the
    workers' (``zygote_log``): it imports torch while the launcher finishes its own start
    (imports, reaper, cgroup) instead of after it. After the run's logs are locked."""
    env = zygote_environment(first_env)
    prestart(python, env, preload, zygote_log(first_log, env))


def drop_prestarted() -> None:
    """Stop a prestarted zygote no group took (the launcher ends before its workers start)."""
    while _prestarted:
        _prestarted.pop().close()


def zygote_command() -> list[str]:
    """How the job's interpreter runs the zygote: ``zygote.py`` by its path, or, when the
    launcher runs from the zipapp (``clusterddp pack``: every container on SLURM, every
    Kubernetes pod), the archive itself with ``protocol.ZIPAPP_ZYGOTE_ARG``, whose ``__main__``
    imports the zygote (and the zygote the bootstrap) from the archive, as a cold worker's bootstrap is
    run (``bootstrap.command``). Why not extract them to a directory: nothing is written,
    so there is no directory to own, protect, clean up or share between runs, and the zygote
    is the exact code of the launcher that starts it (docs/warm-start.md, "From the zipapp")."""
    if os.path.isfile(ZYGOTE):
        return [ZYGOTE]
    archive = ZYGOTE.rsplit(os.sep + os.path.join("clusterddp", "launch", "start", "zygote.py"), 1)[0]
    if archive != ZYGOTE and os.path.isfile(archive):
        return [archive, protocol.ZIPAPP_ZYGOTE_ARG]
    raise ZygoteLost(f"no zygote.py at {ZYGOTE} and no archive holding it")


def _key(python: str, env: Mapping[str, str], preload: Sequence[str]) -> "_Key":
    return python, tuple(sorted(env.items())), tuple(preload)


def _close(pipes: tuple[int, ...]) -> None:
    for fd in pipes:
        os.close(fd)


def _bootstrap_command() -> list[str]:
    from clusterddp.launch.start import bootstrap

    return bootstrap.command()
