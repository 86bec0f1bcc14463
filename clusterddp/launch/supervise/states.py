"""The local supervisor's states and the moves between them (torch elastic names its
``WorkerState``s the same way): a reader follows a run by these names, and a move that is not
in ``MOVES`` is a bug in the loop, caught where it happens instead of as a wrong exit later."""

from __future__ import annotations

import enum


class State(enum.Enum):
    #: Before the first worker: signal handlers, the event log, launcher.json.
    STARTING = "starting"
    #: An attempt's workers run and are watched until they end or are told to.
    RUNNING = "running"
    #: The attempt's workers are torn down (their stop signal, the grace period, SIGKILL).
    STOPPING = "stopping"
    #: The attempt's end is weighed: its exit code, the restart verdict, the backoff.
    JUDGING = "judging"
    #: Reported to whoever restarts the job as a whole (the SSH head, the srun step's node 0):
    #: waiting for its word, the next attempt in place or the end.
    AWAITING_WORD = "awaiting_word"
    #: A local restart's pause (``restart.policy.backoff_seconds``).
    BACKING_OFF = "backing_off"
    #: The report and the result line are out; the exit code is decided.
    FINISHED = "finished"


MOVES: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.RUNNING}),
    State.RUNNING: frozenset({State.STOPPING}),
    State.STOPPING: frozenset({State.JUDGING}),
    State.JUDGING: frozenset({State.AWAITING_WORD, State.BACKING_OFF, State.FINISHED}),
    State.AWAITING_WORD: frozenset({State.RUNNING, State.FINISHED}),
    State.BACKING_OFF: frozenset({State.RUNNING, State.FINISHED}),
    State.FINISHED: frozenset(),
}


class Lifecycle:
    """The current state and the states passed through, changed only by ``enter``."""

    def __init__(self) -> None:
        self.state = State.STARTING
        self.passed: list[State] = [State.STARTING]

    def enter(self, state: State) -> None:
        if state not in MOVES[self.state]:
            raise RuntimeError(f"the supervisor cannot go from {self.state.value} to {state.value}")
        self.state = state
        self.passed.append(state)
