"""The ``clusterddp`` command's first code: stop signals are handled before the CLI's own
imports (about 50 ms) run, so a SIGTERM at any moment ends it with 143 (clusterddp.earlystop)."""

from __future__ import annotations

import signal
import sys

from clusterddp import earlystop


def main() -> int:
    try:  # installed inside: a signal the moment after the first handler is set is caught too
        earlystop.install()
        from clusterddp.cli import main as cli_main
    except earlystop.StoppedEarly as exc:  # while importing: nothing was started yet
        print(f"clusterddp: stopped by {exc.name}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("clusterddp: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    return cli_main()
