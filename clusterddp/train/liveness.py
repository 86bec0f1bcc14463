"""A cheap "I am still making progress" signal for the launcher's hang detector.

The launcher sets ``protocol.HEARTBEAT_FILE_ENV`` to a per-worker path and watches its
mtime; a rank stuck in a collective stops touching it. Touching a file costs a system
call, so calls closer than ``MIN_INTERVAL`` seconds are dropped: the training loop can call
``heartbeat()`` every step without measuring it. No torch here: any script may use it.
"""

from __future__ import annotations

import os
import time

from clusterddp.protocol import HEARTBEAT_FILE_ENV

#: At most one touch per this many seconds.
MIN_INTERVAL = 1.0

_last_touch = float("-inf")


def heartbeat() -> bool:
    """Touch the file ``HEARTBEAT_FILE_ENV`` names unless it was touched less than a second ago.

    Returns True when the file was touched. Errors (a vanished directory) are swallowed:
    a missing heartbeat must never be the reason a training run dies.
    """
    global _last_touch
    now = time.monotonic()
    if now - _last_touch < MIN_INTERVAL:
        return False
    path = os.environ.get(HEARTBEAT_FILE_ENV)
    if not path:
        return False
    _last_touch = now
    try:
        try:
            os.utime(path)
        except FileNotFoundError:
            with open(path, "a"):
                pass
    except OSError:
        return False
    return True


def reset() -> None:
    """Forget the last touch so the next call touches at once (a new run in the same process)."""
    global _last_touch
    _last_touch = float("-inf")
