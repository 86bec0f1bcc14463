"""The outermost frame of a training script: clean exits with meaningful codes.

``run_main(main)`` turns the library's agreed stops into process exits: a non-finite loss
becomes one message from rank 0 and exit code 65 on every rank (no N copies of the same
traceback), a preemption exits 75, and the process group is always left cleanly.
"""

from __future__ import annotations

import sys
from typing import Callable, NoReturn

from clusterddp.train.dist import cleanup, get_rank
from clusterddp.train.exitcodes import NONFINITE_LOSS_EXIT_CODE
from clusterddp.train.guard import NonFiniteLossError


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Call ``main()``, leave the process group, and exit with its code.

    Other exceptions propagate as usual (a traceback is what a bug needs).
    """
    try:
        code = main() or 0
    except NonFiniteLossError as exc:
        if get_rank() == 0:
            print(f"clusterddp.train: {exc}", file=sys.stderr, flush=True)
        code = NONFINITE_LOSS_EXIT_CODE
    finally:
        cleanup()
    sys.exit(code)
