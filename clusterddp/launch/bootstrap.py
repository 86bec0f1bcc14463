"""The first code every worker runs: arm a stack dump on a signal, then run the real script.

``python .../clusterddp/launch/bootstrap.py SCRIPT ARGS`` (or ``-m MODULE ARGS``) behaves like
``python SCRIPT ARGS``: ``sys.argv``, ``__main__`` and ``__file__`` are the script's. Before
that, ``faulthandler`` is registered on ``protocol.DUMP_SIGNAL`` to append every thread's
Python stack to the file ``protocol.STACKS_FILE_ENV`` names, without stopping the process, so
``clusterddp stacks`` and the hang detector work for any script, not only ones that use
clusterddp.train. It is run by file path and imports only the standard library (and
``clusterddp/protocol.py``, loaded by its path next to this file), so it works under any
interpreter a job names (``python:``), even one where clusterddp is not installed, and costs
a few milliseconds.
"""

from __future__ import annotations

import faulthandler
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types

_stacks_file = None  # kept open for the process's life: faulthandler writes to its fd
#: The zipapp's argument that runs this bootstrap (clusterddp.pack spells it the same).
ZIPAPP_ARG = "--clusterddp-bootstrap"


def command() -> list[str]:
    """How a worker's interpreter runs this file: by its path, or, when the launcher runs from
    a zipapp (``clusterddp pack``, in a container), through the archive's ``__main__``."""
    here = os.path.abspath(__file__)
    if os.path.isfile(here):
        return [here]
    archive = here.rsplit(os.sep + os.path.join("clusterddp", "launch", "bootstrap.py"), 1)[0]
    return [archive, ZIPAPP_ARG]


def protocol() -> types.ModuleType:
    """``clusterddp/protocol.py`` by its path (no ``import clusterddp``: it may not be
    importable by this interpreter), as a private module left out of ``sys.modules``."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "protocol.py")
    if not os.path.isfile(path):  # inside the zipapp, whose clusterddp is importable
        import clusterddp.protocol

        return clusterddp.protocol
    spec = importlib.util.spec_from_file_location("_clusterddp_protocol", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arm_stack_dump() -> None:
    global _stacks_file
    shared = protocol()
    path = os.environ.get(shared.STACKS_FILE_ENV)
    if not path:
        return
    try:
        _stacks_file = open(path, "a", buffering=1)
    except OSError:
        return
    faulthandler.register(shared.DUMP_SIGNAL, file=_stacks_file, all_threads=True, chain=False)


def main() -> None:
    arm_stack_dump()
    args = sys.argv[1:]
    if args[:1] == ["-m"]:
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()  # as 'python -m MODULE' does
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    run_script(args[0], args)


def run_script(path: str, argv: list[str]) -> None:
    """Execute ``path`` as ``__main__`` exactly as ``python path`` would (argv[0] as given,
    ``__file__`` absolute, the script's directory first on sys.path)."""
    script = os.path.abspath(path)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(script)
    module = types.ModuleType("__main__")
    module.__file__ = script
    module.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module
    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    exec(code, module.__dict__)


if __name__ == "__main__":
    main()
