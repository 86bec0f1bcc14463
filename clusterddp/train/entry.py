"""The outermost frame of a training script: clean exits with meaningful codes.

``run_main(main)`` turns the library's agreed stops into process exits: a non-finite loss
(or weights a checkpoint refused) becomes one message from rank 0 and exit code 65 on
every rank (no N copies of the same traceback), a preemption exits 75, and the process
group is always left cleanly.
"""

from __future__ import annotations

import sys
from typing import Callable, NoReturn

from clusterddp.train.ckptstore import CheckpointError
from clusterddp.train.dist import barrier, cleanup, get_rank
from clusterddp.train.exitcodes import NONFINITE_LOSS_EXIT_CODE, PREEMPTED_EXIT_CODE
from clusterddp.train.guard import NonFiniteError


#: Exits every rank takes together (the library agrees on them across ranks first).
AGREED_EXITS = (0, NONFINITE_LOSS_EXIT_CODE, PREEMPTED_EXIT_CODE)


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Call ``main()``, leave the process group, and exit with its code.

    Other exceptions propagate as usual (a traceback is what a bug needs).
    """
    try:
        code = _call(main)
    except BaseException:
        cleanup()
        raise
    # Only here, with main's frames and any SystemExit (a preemption) gone, can cleanup's
    # garbage collection free DDP before the group is destroyed; otherwise gloo's destructor
    # runs at interpreter exit and aborts the process ("terminate called without an active
    # exception"), and a saved preemption looks like a crash.
    if code in AGREED_EXITS:
        # Every rank reached this same decision together, so all are alive: meet once more,
        # so no rank tears its sockets down while a peer is still inside the group (gloo
        # then aborts the slower rank, about once in thirty NaN stops measured here).
        barrier()
    cleanup()
    sys.exit(code)


def _call(main: Callable[[], int | None]) -> int:
    """``main()``'s exit code, with the library's agreed stops turned into codes."""
    try:
        return main() or 0
    except CheckpointError as exc:  # bad input (a directory in use or unwritable): one line
        if get_rank() == 0:
            print(f"clusterddp.train: {exc}", file=sys.stderr, flush=True)
        return 2
    except NonFiniteError as exc:  # a NaN loss, or weights refused by a checkpoint
        if get_rank() == 0:
            print(f"clusterddp.train: {exc}", file=sys.stderr, flush=True)
        return NONFINITE_LOSS_EXIT_CODE
    except SystemExit as exc:  # Preempted, or sys.exit() inside main
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr, flush=True)
        return 1
