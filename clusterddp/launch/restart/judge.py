"""What follows one attempt of this node's group: its exit code, the restart verdict, the
backoff, and the few words the event log keeps; pure, plain data in (the supervisor's JUDGING).

The parts are ``policy`` (restarts left, backoff, exits never restarted) and ``verdict`` (will
the failure repeat); this module is where they meet, in the order a user reads the result:
a failure that will repeat is not restarted even with restarts left, and says so once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from clusterddp.launch.observe.exits import WorkerExit
from clusterddp.launch.restart.policy import RestartPolicy, end_reason, exit_code
from clusterddp.launch.restart.verdict import Failure, failure_of, rank_ends, verdict
from clusterddp.spec import RestartOnSpec


@dataclass(frozen=True)
class Judgement:
    code: int
    failure: Failure | None
    #: Seconds before a local restart; None: no local restart.
    backoff: float | None
    #: Why (not) restarted, for the event log's attempt_end.
    why: str
    #: The one line the console gets about the verdict, if any.
    said: str | None


@dataclass(frozen=True)
class AttemptFacts:
    """What the judge needs to know of the attempt that just ended and of the run so far."""

    number: int
    exits: Sequence[WorkerExit]
    root: WorkerExit | None
    hang: str | None
    peer: str | None
    stop_reason: str | None
    stop_signal: int | None
    progressed: bool
    #: The previous attempt's failure, if it failed (the verdict compares the two).
    previous: Failure | None
    first_attempt: int


def judge(facts: AttemptFacts, policy: RestartPolicy, restart_on: RestartOnSpec,
          restarted_outside: bool) -> Judgement:
    """The attempt's end weighed. A failure is a worker's non-zero exit, a hang (exit 124) or
    another node's end; an attempt that ended because another node's did failed elsewhere:
    nothing here to judge but its code."""
    failed = facts.root is not None or facts.hang is not None or facts.peer is not None
    stopping = facts.stop_reason is not None
    root = facts.root
    code = exit_code(root, facts.exits, facts.hang is not None, facts.stop_signal) if failed or stopping else 0
    backoff = policy.backoff(facts.number, code if failed else None, stopping=stopping)
    failure = failure_of(code, root.signal_name if root else None, root.tail if root else (),
                         hang=facts.hang is not None) if failed and not facts.peer else None
    repeat, spared = verdict(failure, facts.progressed, facts.previous,
                             facts.first_attempt + facts.number - 1 if facts.previous else None,
                             restart_on, rank_ends(facts.exits)) if failure else (None, None)
    said = None
    if backoff is not None and repeat:
        said = f"clusterddp: not restarting: {repeat}"
        backoff = None
    elif backoff is not None and spared:
        said = f"clusterddp: restarting: {spared}"
    why = repeat or end_reason(policy, facts.number, code if failed else None, facts.stop_reason)
    if spared and backoff is not None:
        why = f"{spared}: restarting"
    if failed and restarted_outside and not stopping:
        why = "whole-job restarts are decided by whoever started the nodes"
    return Judgement(code, failure, backoff, why, said)
