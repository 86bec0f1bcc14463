"""The first code every worker runs: arm a stack dump on a signal, run the script, end cleanly.

``python .../clusterddp/launch/start/bootstrap.py SCRIPT ARGS`` (or ``-m MODULE ARGS``) behaves like
``python SCRIPT ARGS`` (``python -m MODULE ARGS``): the script sees the same ``sys.argv``,
``sys.orig_argv``, ``sys.path[0]``, ``__main__`` (``__file__``, ``__cached__``,
``__annotations__``, ``__spec__``...) and the same traceback when it raises, with no frame of
this file in it.

Before the script, ``faulthandler`` is registered on ``protocol.DUMP_SIGNAL`` to append every
thread's Python stack to the file ``protocol.STACKS_FILE_ENV`` names, without stopping the
process, so ``clusterddp stacks`` and the hang detector work for any script.

After the script (it returned, raised SystemExit or another exception) the bootstrap does what
Python's own shutdown does that a script can observe, in Python's order: print the traceback
(exit 1), wait for non-daemon threads, run the ``atexit`` handlers (logging's flush and close,
``weakref.finalize``, multiprocessing's joins), flush ``sys.stdout``/``sys.stderr``, every
open file object and C stdio, and then ends the process with ``os._exit`` *before* the
interpreter finalizes. What it skips is finalization itself: module teardown, ``__del__`` of
objects still alive, C++ static destructors. That is where a gloo thread races the dying
interpreter and aborts a finished job (pytorch/pytorch#190489, exit 134); skipping it avoids
the race instead of changing its odds. docs/train.md says what a script can no longer rely on.

It is run by file path and imports only the standard library (and ``clusterddp/protocol.py``,
loaded by its path with ``load``, the one loader of the files that run in the job's python:
the zygote loads what it needs with it too), so it works under any interpreter a job names
(``python:``, 3.9 or later), even one where clusterddp is not installed, and costs a few
milliseconds. ``run_main`` is the reusable part: whoever already has an interpreter (a warm
one that forks workers) calls it in the child to run a script and end the way a worker ends.
"""

from __future__ import annotations

import builtins
import faulthandler
import importlib.machinery
import importlib.util
import os
import signal
import sys
import types
from typing import NamedTuple, NoReturn, Sequence

_stacks_file = None  # kept open for the process's life: faulthandler writes to its fd
#: Frames of this file are cut from the script's tracebacks (the zipapp's path included).
_HERE = __file__


def load(*parts: str) -> types.ModuleType:
    """The module ``clusterddp.<parts>``, the one way the files that run in the job's python
    (this bootstrap, the zygote) load clusterddp's: imported as usual where this file was
    itself imported from the package (the launcher; the zipapp, whose files are not on disk),
    else by its path, as a private module left out of ``sys.modules`` (no ``import
    clusterddp``: this interpreter may not have it, and the script must not find it there)."""
    dotted = ".".join(("clusterddp", *parts))
    if __name__.startswith("clusterddp."):
        return importlib.import_module(dotted)
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # clusterddp/
    path = os.path.join(package, *parts) + ".py"
    spec = importlib.util.spec_from_file_location("_" + dotted.replace(".", "_"), path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: ``clusterddp/protocol.py``: the names this bootstrap shares with the launcher.
protocol = load("protocol")


def command() -> list[str]:
    """How a worker's interpreter runs this file: by its path, or, when the launcher runs from
    a zipapp (``clusterddp pack``, in a container), through the archive's ``__main__``."""
    here = os.path.abspath(__file__)
    if os.path.isfile(here):
        return [here]
    archive = here.rsplit(os.sep + os.path.join("clusterddp", "launch", "start", "bootstrap.py"), 1)[0]
    return [archive, protocol.ZIPAPP_BOOTSTRAP_ARG]


def arm_stack_dump() -> None:
    global _stacks_file
    path = os.environ.get(protocol.STACKS_FILE_ENV)
    if not path:
        return
    try:
        _stacks_file = open(path, "a", buffering=1)
    except OSError:
        return
    faulthandler.register(protocol.DUMP_SIGNAL, file=_stacks_file, all_threads=True, chain=False)


def main() -> NoReturn:
    """The worker's entry: ``bootstrap.py SCRIPT ARGS`` or ``bootstrap.py -m MODULE ARGS``."""
    arm_stack_dump()
    _hide_from_orig_argv(command())
    run_main(sys.argv[1:])


def run_main(target: Sequence[str]) -> NoReturn:
    """Run ``target`` (``[SCRIPT, ARGS...]`` or ``["-m", MODULE, ARGS...]``) as ``__main__``,
    as ``python`` would, then end the process as Python would but without finalizing (see the
    module docstring): the one way a worker runs its script and ends, cold or forked."""
    end(run(target))


class Ending(NamedTuple):
    """How the script ended, as Python's main sees it."""

    #: 0 when it returned, the SystemExit code's status (``protocol.exit_status``), 1 after
    #: an uncaught exception.
    status: int
    #: An uncaught KeyboardInterrupt: Python ends such a process by killing itself with
    #: SIGINT (after its cleanup), so that its parent sees the Ctrl-C.
    interrupted: bool = False


def run(target: Sequence[str]) -> Ending:
    """Run the script and say how it ended; the traceback of an uncaught exception is printed
    (through ``sys.excepthook``) as Python's main prints it."""
    try:
        if target[0] == "-m":
            _run_module(target[1], list(target[2:]))
        else:
            _run_script(target[0], list(target))
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            _print_exit_message(exc.code)
        return Ending(protocol.exit_status(exc.code))
    except BaseException as exc:  # noqa: BLE001 (whatever the script raises, as Python's main)
        _print_uncaught(exc)
        return Ending(1, interrupted=isinstance(exc, KeyboardInterrupt))
    return Ending(0)


def end(ending: Ending) -> NoReturn:
    """End the process as ``ending`` says, after what Python's shutdown does before it
    finalizes: join non-daemon threads, run atexit handlers, flush every stream."""
    status = ending.status
    _announce_exit()
    try:  # whatever happens meanwhile (a second Ctrl-C), the process never reaches finalization
        threading = sys.modules.get("threading")
        if threading is not None:
            try:  # what Py_FinalizeEx calls first: waits for non-daemon threads, runs their hooks
                threading._shutdown()
            except BaseException:  # noqa: BLE001 (a Ctrl-C while waiting: go on ending, as Python)
                pass
        _run_atexit()
        if not _flush_std():
            status = 120  # as Python, when stdout cannot be flushed at exit
        _flush_files()
        _flush_c_stdio()
    finally:
        if ending.interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            status = 128 + signal.SIGINT  # if SIGINT did not end us: the shell's code for it
        os._exit(status & 0xFF)


# -- the script as __main__ ---------------------------------------------------------------------

def _new_main() -> types.ModuleType:
    """A fresh ``__main__`` with what the interpreter puts in its own before any script runs
    (``__annotations__`` included), in the same order, registered in ``sys.modules``."""
    module = types.ModuleType("__main__")
    module.__dict__["__annotations__"] = {}
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    return module


def _run_script(path: str, argv: list[str]) -> None:
    """Execute ``path`` as ``__main__`` exactly as ``python path`` would: argv[0] as given,
    ``__file__`` absolute, ``__cached__`` None, the script's real directory first on sys.path,
    the script's own ``__future__`` imports only (``dont_inherit``)."""
    script = os.path.abspath(path)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    module = _new_main()
    module.__dict__["__file__"] = script
    module.__dict__["__cached__"] = None
    module.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    with open(script, "rb") as f:
        source = f.read()
    exec(compile(source, script, "exec", dont_inherit=True), module.__dict__)


def _run_module(name: str, args: list[str]) -> None:
    """Execute module ``name`` as ``python -m name`` does, through the same runpy function
    (so a traceback shows the same two runpy frames it shows), in a fresh ``__main__``."""
    import runpy

    sys.argv = ["-m", *args]  # what the module's parent packages see while they import
    sys.path[0] = os.getcwd()
    _new_main()
    run_as_main = getattr(runpy, "_run_module_as_main", None)
    if run_as_main is None:  # not CPython's runpy: the public function, one frame more
        sys.argv[0] = name
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        return
    run_as_main(name, alter_argv=True)


def _hide_from_orig_argv(bootstrap: list[str]) -> None:
    """``sys.orig_argv`` without this bootstrap's arguments: ``python SCRIPT ARGS`` as if the
    script had been run directly (3.10 or later; earlier Pythons have no orig_argv)."""
    orig = getattr(sys, "orig_argv", None)
    if not orig:
        return
    wanted = [os.path.abspath(bootstrap[0]), *bootstrap[1:]]
    for i in range(1, len(orig) - len(bootstrap) + 1):
        here = orig[i:i + len(bootstrap)]
        if [os.path.abspath(here[0]), *here[1:]] == wanted:
            sys.orig_argv = orig[:i] + orig[i + len(bootstrap):]
            return


# -- the end of a script, as Python's main ends it ----------------------------------------------

def _print_exit_message(code: object) -> None:
    """``sys.exit("message")``: Python prints the message to stderr (and exits 1)."""
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: BLE001 (a closed stderr: the status still says it)
        pass


def _print_uncaught(exc: BaseException) -> None:
    """Hand the exception to ``sys.excepthook`` (as PyErr_Print: sys.last_* set first), its
    traceback starting at the script's frame, as ``python script.py`` shows it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _HERE:
        tb = tb.tb_next
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException as hook_error:  # noqa: BLE001 (Python prints both, then goes on)
        try:
            sys.stderr.write("Error in sys.excepthook:\n")
            sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
            sys.stderr.write("\nOriginal exception was:\n")
            sys.__excepthook__(type(exc), exc, tb)
        except BaseException:  # noqa: BLE001
            pass


def _announce_exit() -> None:
    """Tell the launcher that the script returned, in the progress file, when the script
    keeps one (``clusterddp.train.liveness`` is loaded: nothing is imported for it here), so
    the ending below (threads, atexit handlers: seconds under load) is no stall to
    ``hang_timeout: auto``."""
    ended = getattr(sys.modules.get("clusterddp.train.liveness"), "ended", None)
    if callable(ended):
        try:
            ended()
        except Exception:  # noqa: BLE001 (a record that cannot be written must not change the end)
            pass


def _run_atexit() -> None:
    """The atexit handlers, last registered first; each one's exception is printed and the
    rest still run (``atexit._run_exitfuncs`` does both)."""
    import atexit

    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 (a Ctrl-C inside one: the others are lost, as in Python)
        pass


def _flush_std() -> bool:
    """Flush ``sys.stdout`` and ``sys.stderr`` (what the script may have swapped in) and the
    originals; False when stdout could not be flushed (Python then exits 120)."""
    ok = True
    for name in ("stdout", "stderr", "__stdout__", "__stderr__"):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (a closed pipe: nothing more to do for it)
            if name == "stdout":
                ok = False
    return ok


def _flush_files() -> None:
    """Flush every open writable file object: finalization would have flushed (and closed)
    the ones the script left open, such as a module-level ``log = open(...)``.

    Text layers first, so their buffers reach the binary layer flushed after them. Tested by
    the type alone: ``isinstance`` would read each object's ``__class__``, which some objects
    answer with code (torch's deprecated ``reduce_op`` warns)."""
    import _io
    import gc

    text, binary = [], []
    for obj in gc.get_objects():
        kind = type(obj)
        if issubclass(kind, _io._TextIOBase):
            text.append(obj)
        elif issubclass(kind, _io._BufferedIOBase):  # also gzip/bz2/lzma files: flushed, not closed
            binary.append(obj)
    for stream in (*text, *binary):
        try:
            if not stream.closed:
                stream.flush()
        except Exception:  # noqa: BLE001 (unwritable or half-built: leave it, as finalization would)
            pass


def _flush_c_stdio() -> None:
    """``fflush(NULL)``: what C and C++ code printed (stdout to a pipe is fully buffered),
    which ``exit()`` would flush and ``os._exit`` does not."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001 (no libc to load: nothing buffered there to lose)
        pass


if __name__ == "__main__":
    main()
