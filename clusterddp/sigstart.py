"""The signal dispositions the launcher inherited, handed on to every worker and zygote.

``python script.py`` keeps what its parent left it: under ``nohup`` SIGHUP stays ignored; as
a shell's background job, SIGINT and SIGQUIT do. The launcher installs handlers of its own
for some signals (the stop signals, SIGCHLD), and ``exec`` resets a handled signal to its
default: a cold worker started after that got SIGHUP back at default, while a zygote started
before kept it ignored and passed that on to every worker it forked, so a script could tell
the two apart and neither was what ``python script.py`` would have had.

So the dispositions are read once, when this module is first imported (``clusterddp``'s
``__init__`` imports it before anything can install a handler), and ``restore`` sets them in a
child between fork and exec: ignored what the launcher found ignored, default everything else
(a handler does not survive ``exec`` anyway). A warm worker inherits them from its zygote.

Except the stop signals (``protocol.STOP_SIGNALS``): the launcher takes those over whatever it
inherited, and stops its workers with them on purpose (a Ctrl-C reaches a script as SIGINT, so
its ``except KeyboardInterrupt`` runs). A worker that inherited SIGINT ignored from a shell's
background job would let that stop pass by and be killed after the grace period instead; so
a worker always has them at their default, warm or cold alike.
"""

from __future__ import annotations

import ctypes
import signal

from clusterddp.protocol import STOP_SIGNALS

#: Python ignores these at its own start whatever the parent left, and ``subprocess`` puts
#: them back to default before exec (``restore_signals``): the child's Python ignores them
#: again, as ``python script.py``'s would. Never touched here.
_PYTHON_OWN = frozenset(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name))
#: Signals whose disposition cannot be changed.
_FIXED = frozenset((signal.SIGKILL, signal.SIGSTOP))


def _ignored_now() -> frozenset[int]:
    """Signals whose disposition is SIG_IGN, as Python knows it (read from the kernel at its
    start, changed only by ``signal.signal``)."""
    found = set()
    for sig in signal.valid_signals():
        if sig in _FIXED or sig in _PYTHON_OWN:
            continue
        try:
            if signal.getsignal(sig) is signal.SIG_IGN:
                found.add(int(sig))
        except (OSError, ValueError):
            continue
    return frozenset(found)


#: What the launcher's parent left ignored (the module docstring says when it is read).
INHERITED_IGNORED = _ignored_now()
#: What a worker keeps ignored: all of that but the stop signals, which the launcher owns.
KEPT_IGNORED = INHERITED_IGNORED - frozenset(int(sig) for sig in STOP_SIGNALS)

_set_handler: ctypes._CFuncPtr | None  # type: ignore[name-defined]
try:
    _set_handler = ctypes.CDLL(None, use_errno=True).signal
    _set_handler.argtypes = [ctypes.c_int, ctypes.c_void_p]
    _set_handler.restype = ctypes.c_void_p
except (OSError, AttributeError):  # no libc signal(): the child keeps what exec leaves
    _set_handler = None

_SIG_DFL, _SIG_IGN = 0, 1


def restore() -> None:
    """In a child between fork and exec: the launcher's inherited dispositions. Only libc
    calls (no ``signal.signal``: it works in the main thread only, and the Python handlers of
    a process about to exec are moot)."""
    if _set_handler is None:
        return
    for sig in KEPT_IGNORED:
        _set_handler(sig, _SIG_IGN)
    for sig in _ignored_now() - KEPT_IGNORED:  # ignored since, or a stop signal: not by the worker
        _set_handler(sig, _SIG_DFL)
