"""The warm interpreter of one node: import torch once, then fork each worker on request.

``python .../clusterddp/launch/start/zygote.py FD [PRELOAD...]`` is started by the launcher
(``warm.py``) by its path, like ``bootstrap.py`` (from the zipapp: ``python ARCHIVE.pyz
--clusterddp-zygote FD [PRELOAD...]``, warm.zygote_command), under the job's interpreter, in its own
session, dying with the launcher. It imports torch and the job's ``preload:`` modules and
initialises nothing (no CUDA, no process group, no thread pool), checks that a fork is safe
(no thread started beyond the ones ``import torch`` starts, CUDA not initialised), says so on
the unix socket FD, and then serves one request per worker: an argv, environment, cwd, CPUs
and cgroup as JSON, with the worker's stdin/stdout/stderr passed as descriptors
(SCM_RIGHTS). Each worker is made by a double fork, so that it becomes the launcher's child:

- the zygote forks an intermediate, which forks the worker (a run of an attempt's workers,
  one after the other: ``serve``) and exits as soon as they are each in their own session
  (``setsid``), have their stdio and joined the job's cgroup;
- the launcher is a child subreaper, so the orphaned worker is reparented to it: it is the
  launcher's child like a cold one, and ``waitpid`` gives the supervisor its exit code or
  signal exactly as for a cold worker (no status relayed over a socket, none lost when the
  zygote dies);
- the worker then ties ``PR_SET_PDEATHSIG`` to its new parent, the launcher (set earlier,
  it would fire when the intermediate exits), and runs the script through ``bootstrap.main``,
  the same function a cold worker runs, with ``sys.argv`` and ``sys.orig_argv`` of the cold
  command line.

A worker runs the script only once the launcher has its pid: with its stdio the launcher
passes the read end of a *go* pipe, whose write end only the launcher holds. The worker
waits for a byte on it, which the launcher writes when it has read the zygote's reply for
that worker; the launcher closes it unwritten when it gives up on the zygote before that
reply (the zygote died or stopped between a fork and its reply), and the worker, seeing EOF,
exits without running anything: the launcher then starts that rank cold, and no rank runs
twice.

Test hook (tests/core/test_warm.py only): with ``CLUSTERDDP_TEST_ZYGOTE_SIGNAL`` set to a
signal number in its environment, the zygote sends itself that signal (9: killed, 19:
stopped) right before its last reply to an attempt's requests, once every worker of it is
forked, and says their pids on its stderr (its log) first.

Only the standard library is imported here besides torch and the preloads. ``bootstrap.py``
is run by its path as Python runs a file (``runpy.run_path``), out of ``sys.modules``; from the
zipapp, imported from the archive as ``clusterddp.launch.start.bootstrap``, as a cold worker of the
zipapp imports it. Everything else of clusterddp comes through the bootstrap's one loader
(``bootstrap.load``): the socket's framing from ``protocol.py`` (``send_frame`` /
``receive_frame``, shared with the launcher's side), the fork with a pipe from
``launch/teardown/forking.py``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import importlib
import math
import os
import select
import socket
import sys
import threading
import time
import types
from typing import Any, Iterator

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: Seconds a new worker waits to be reparented to the launcher before it gives up.
_REPARENT_WAIT = 10.0
#: Test hook (module docstring): a signal number the zygote sends itself before its last reply.
_TEST_SIGNAL = "CLUSTERDDP_TEST_ZYGOTE_SIGNAL"
#: ``protocol.py`` (the socket's framing) and ``launch/teardown/forking.py``, which ``main``
#: takes from the bootstrap's loader before anything is sent.
_protocol: Any = None
_forking: Any = None


def _tasks() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def warm_up(preloads: list[str]) -> str | None:
    """Import torch and the preloads; why a fork would be unsafe now (None: it is safe).

    Meanwhile the zygote is a child subreaper (``_imports_adopt``): a process the imports
    start in a new session stays in its tree, for the launcher's teardown to find."""
    with _imports_adopt():
        return _warm_up(preloads)


@contextlib.contextmanager
def _imports_adopt() -> Iterator[None]:
    """The zygote a child subreaper while it imports: a daemon a preload double-forks comes
    back to it, not to init or the launcher (which may not be a subreaper yet, and takes a
    child it did not start for a worker's orphan). Undone before the first fork of a worker,
    whose intermediate must leave it to the launcher (module docstring)."""
    libc = None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except OSError:
        pass
    try:
        yield
    finally:
        if libc is not None:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _warm_up(preloads: list[str]) -> str | None:
    if not hasattr(os, "fork"):
        return "this Python has no fork"
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001 (whatever the import raises: cold start)
        return f"cannot import torch: {type(exc).__name__}: {exc}"
    native = _tasks()  # the threads import torch starts (fork copies only this one)
    for name in preloads:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001
            return f"preload {name}: {type(exc).__name__}: {exc}"
        if threading.active_count() > 1:
            return f"preload {name} started a Python thread ({threading.active_count() - 1} running)"
        if _tasks() > native:
            return f"preload {name} started {_tasks() - native} native thread(s)"
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            return f"preload {name} initialised CUDA"
    return None


def serve(sock: socket.socket) -> dict[str, Any]:
    """Fork a worker per request until the launcher closes the socket (then exit); returns
    only in a new worker, with its request, ready to run the script.

    The launcher sends an attempt's requests back to back, the first saying how many there
    are (``batch``); they are taken together and shared out over about sqrt(n) intermediates, each forking its share of workers in turn: the zygote forks k of them,
    not one per worker, so n workers cost k + n forks of this large process instead of 2n,
    and the last worker is forked after about k + n/k of them, not n + 1 (8 workers: 3
    intermediates, 11 forks, the last after 6). The replies still go back one per request,
    in order. A request's descriptors: the worker's stdin, stdout, stderr and the read end
    of its go pipe (module docstring)."""
    pending: collections.deque[tuple[int, int, int] | str] = collections.deque()
    while True:
        if pending and not _queued(sock):
            oldest = pending.popleft()
            _reply(sock, oldest, last=not pending)
            continue
        batch: list[tuple[dict[str, Any], list[int]]] = []
        while not batch or len(batch) < int(batch[0][0].get("batch") or 1):
            request, fds = _protocol.receive_frame(sock, max_fds=4)
            if request is None:
                os._exit(0)
            batch.append((request, fds))
        for share in _shares(batch):
            started: tuple[int, int, int] | dict[str, Any] | str
            try:
                started = _fork_middle(sock, share)
            except OSError as exc:
                started = f"fork: {exc.strerror or exc}"
            if isinstance(started, dict):
                return started  # in a worker: its descriptors are its stdio now
            for _request, fds in share:
                for fd in fds:
                    os.close(fd)
            pending.extend([started] * len(share) if isinstance(started, str) else [started])


def _shares(batch: list[Any]) -> list[list[Any]]:
    """``batch`` cut in order into about sqrt(len) runs of about equal length."""
    count = math.isqrt(len(batch) - 1) + 1 if batch else 0
    size = -(-len(batch) // count) if count else 0
    return [batch[i:i + size] for i in range(0, len(batch), size)] if size else []


def _queued(sock: socket.socket) -> bool:
    """True when the launcher's next request is already here (no wait)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _reply(sock: socket.socket, started: tuple[int, int, int] | str, last: bool = False) -> None:
    """The pids of an intermediate's workers, in order, once it has exited (so they are the
    launcher's children already), or why one failed. ``last``: no other reply pending."""
    if isinstance(started, str):
        _protocol.send_frame(sock, {"error": started})
        return
    middle, report_r, count = started
    os.waitpid(middle, 0)
    with os.fdopen(report_r, "rb") as report:
        pids = report.read().decode().split("\n")
    if last and os.environ.get(_TEST_SIGNAL):  # test hook only (module docstring)
        sys.stderr.write(f"{_TEST_SIGNAL}: zygote {os.getpid()}, workers {' '.join(pids).strip()}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), int(os.environ[_TEST_SIGNAL]))
    for pid in (pids + [""] * count)[:count]:
        _protocol.send_frame(sock, {"pid": int(pid)} if pid else {"error": "the worker did not start"})


def _fork_middle(sock: socket.socket, share: list[tuple[dict[str, Any], list[int]]]) -> tuple[int, int, int] | dict[str, Any]:
    """First half of the double fork: (the intermediate's pid, the pipe it reports its
    workers' pids on, how many) in the zygote; a worker's request in that worker (set up).
    The intermediate exits once each of its workers says it is in its own session with its
    stdio and cgroup, so the launcher never gets a pid without its process group."""
    sys.stdout.flush()
    sys.stderr.flush()
    middle, report = _forking.fork_with_pipe(True)  # the intermediate writes, the zygote reads
    if middle == 0:
        return _middle(sock, share, report)  # only a worker returns
    return middle, report, len(share)


def _middle(sock: socket.socket, share: list[tuple[dict[str, Any], list[int]]], report_w: int) -> dict[str, Any]:
    """In the intermediate: fork its workers in turn (this returns in each, set up, with its
    request), report each one's pid (an empty line: it failed) once it is set up, exit."""
    for request, fds in share:
        try:
            ready_r, ready_w = os.pipe()
            worker = os.fork()
            if worker == 0:
                try:
                    os.close(ready_r)
                    os.close(report_w)
                    sock.close()
                    _set_up(request, fds, ready_w)  # every other descriptor closed
                    os.close(ready_w)  # EOF: set up
                    request["go"] = fds[3]
                except BaseException:  # noqa: BLE001 (never back into the zygote's loop)
                    os._exit(127)
                return request
            os.close(ready_w)
            os.read(ready_r, 1)
            os.close(ready_r)
            os.write(report_w, f"{worker}\n".encode())
        except BaseException:  # noqa: BLE001
            try:
                os.write(report_w, b"\n")
            except OSError:
                pass
    os._exit(0)


def _set_up(request: dict[str, Any], fds: list[int], keep: int) -> None:
    """In the worker: what ``procs.spawn`` does between fork and exec for a cold worker, and
    what a fresh interpreter would have (its stdio only, the worker's env, cwd and argv).
    ``keep`` and the go pipe (``fds[3]``, closed by ``become_worker``) stay open too."""
    os.setsid()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    low = 3  # every descriptor but its stdio, as exec of a cold worker leaves
    for kept in sorted({keep, fds[3]}):
        os.closerange(low, kept)
        low = kept + 1
    os.closerange(low, _max_fd())
    cgroup = request.get("cgroup")
    if cgroup:
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
                procs.write("0")
        except OSError:
            pass  # as a cold worker: not fatal, the other layers still apply
    cpus = request.get("cpus")
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass


def _max_fd() -> int:
    try:
        return max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")


def become_worker(request: dict[str, Any]) -> None:
    """In the worker, once the intermediate is gone: wait for the launcher's go (none: exit
    quietly, this rank starts cold), die with the launcher, take the worker's environment,
    cwd and command line."""
    middle = os.getppid()
    if not os.read(request["go"], 1):  # the launcher gave up on the zygote before it had our pid
        os._exit(0)
    os.close(request["go"])
    launcher = int(request["launcher"])
    deadline = time.monotonic() + _REPARENT_WAIT
    while os.getppid() == middle and time.monotonic() < deadline:
        time.sleep(0.0005)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    except OSError:
        pass
    if os.getppid() != launcher:  # the launcher died meanwhile (or never became our parent)
        os._exit(1)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # a cold worker seeds it from the OS (random reseeds itself)
        numpy_random.seed()
    sys.argv = list(request["argv"][1:])
    sys.orig_argv = list(request["argv"])


def _bootstrap() -> Any:
    """``bootstrap.py`` next to this file, run by its path as Python runs a file (the
    standard library's loader: the zygote has none of its own) in a namespace out of
    ``sys.modules``; imported from the archive where this file was (the zipapp), as a cold
    worker's bootstrap is."""
    if __name__ == "clusterddp.launch.start.zygote":
        from clusterddp.launch.start import bootstrap

        return bootstrap
    import runpy

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")
    return types.SimpleNamespace(**runpy.run_path(path, run_name="_clusterddp_bootstrap"))


def main() -> None:
    global _protocol, _forking
    sock = socket.socket(fileno=int(sys.argv[1]))
    began = time.monotonic()
    unsafe = warm_up(sys.argv[2:])
    try:
        bootstrap = _bootstrap()
        _protocol, before = bootstrap.protocol, set(sys.modules)
        _forking = bootstrap.load("launch", "teardown", "forking")
        loaded = set(sys.modules) - before  # imported from the zipapp: a cold worker has none of them
    except (OSError, ImportError) as exc:  # nothing to say it with: the launcher sees us exit
        sys.stderr.write(f"clusterddp: the zygote cannot load the bootstrap: {exc}\n")
        sys.stderr.flush()
        os._exit(1)
    _protocol.send_frame(sock, {"ready": unsafe is None, "why": unsafe, "seconds": round(time.monotonic() - began, 3)})
    if unsafe is not None:  # stay until the launcher is done with us: it ends what the imports started
        try:
            while sock.recv(4096):
                pass
        finally:
            os._exit(0)
    # Everything imported so far moves to the permanent generation: a worker's collections
    # never walk (and write to) these objects, so their pages stay shared with the zygote
    # instead of being copied in every worker.
    gc.freeze()
    request = serve(sock)
    become_worker(request)
    if sys.argv[:2] == bootstrap.command()[:2] == [sys.argv[0], _protocol.ZIPAPP_BOOTSTRAP_ARG]:
        del sys.argv[1]  # from the zipapp: as its __main__ does before a cold worker's bootstrap
    if __name__ != "__main__":  # imported from the zipapp: a cold worker has no zygote module
        _forget([__name__, *sorted(loaded)])
    bootstrap.main()


def _forget(names: list[str]) -> None:
    """Modules out of ``sys.modules`` and out of their packages: a worker forked from the
    zipapp's zygote has only the modules a cold worker of the zipapp has."""
    for name in names:
        sys.modules.pop(name, None)
        parent, _, leaf = name.rpartition(".")
        package = sys.modules.get(parent)
        if package is not None and hasattr(package, leaf):
            delattr(package, leaf)


if __name__ == "__main__":
    main()
