"""How long a test waits for something that ends as soon as it holds: never less than FLOOR.

The suite must pass on a loaded machine (load 30 on 2 cores runs a process ~15x slower than
an idle one), so a wait's deadline is no claim about speed: it only bounds a failure. Every
waiting helper of the tests (``tests.conftest.wait_for``, the SSH head's ``wait_for`` and
``finish``, the test beds' ``wait_clean`` and ``wait_state``) takes ``patient(timeout)``: a
short deadline written at a call site is raised to FLOOR, at no cost when the condition
holds early. Speed belongs in benchmarks/, not in a deadline.
"""

from __future__ import annotations

#: The shortest deadline of any wait in the tests, in seconds.
FLOOR = 120.0


def patient(timeout: float) -> float:
    """``timeout``, or FLOOR when shorter."""
    return max(timeout, FLOOR)
