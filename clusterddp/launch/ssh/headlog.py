"""The head's own record of a fan-out: its events, and its restart verdict on each attempt.

The SSH head owns the run (docs/architecture.md): it writes
``logs/<run-id>/events.jsonl`` on the head (``run_start``, each ``attempt_start`` and
``attempt_end`` with its verdict, ``restart``, ``stop``, ``run_end``), while every host's
launcher writes ``events.node<K>.jsonl`` in its own log directory (gathered by ``gather``
where that is not the head's). ``clusterddp report`` merges them.

The verdict is the one-node launcher's (``launch/restart/verdict.py``), applied to the root cause
across hosts: the failed worker's exit, signal and traceback come in its host's result
line, whether any rank completed a step in every host's (``protocol.result_line``), the
previous attempt's failure is remembered here. A failure that will repeat is not restarted,
with the same ``not restarting: ...`` line as on one node.
"""

from __future__ import annotations

import socket
from typing import Sequence

from clusterddp.events import EventLog
from clusterddp.launch.observe.runlog import process_start_time
from clusterddp.launch.restart.policy import RestartPolicy, end_reason
from clusterddp.launch.ssh.outcome import Outcome, attempt_failure, progressed, rank_ends, verdict_failure
from clusterddp.launch.restart.verdict import Failure, verdict
from clusterddp.spec import JobSpec


class HeadLog:
    """The head's event log (opened once the first attempt is about to start) and verdicts."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.events: EventLog | None = None
        self._previous: Failure | None = None
        self._previous_number: int | None = None

    def open(self, run_dir: str, hosts: Sequence[str]) -> None:
        """Start the head's ``events.jsonl`` in ``run_dir`` (once) with ``run_start``."""
        if self.events is not None:
            return
        self.events = EventLog(run_dir, None, socket.gethostname())
        self.emit("run_start", job=self.job.name, hosts=list(hosts), restarts=self.job.restarts,
                  hang_timeout=self.job.hang_timeout, process_start=process_start_time())

    def emit(self, kind: str, **fields: object) -> None:
        if self.events is not None:
            self.events.emit(kind, **fields)

    def attempt_started(self, number: int, hosts: Sequence[str], ranks: int) -> None:
        if self.events is not None:
            self.events.attempt = number
        self.emit("attempt_start", ranks=ranks, hosts=list(hosts))

    def judge(self, outcome: Outcome, number: int) -> tuple[str | None, str | None]:
        """``verdict.verdict`` on the attempt's failure, from every host's ranks: why it will
        repeat (the rest of ``not restarting: ...``), or why a failure that looked
        deterministic is restarted (``restarting: ...``: it hit some ranks only).

        Remembers the failure for the next attempt's judgement ("the same ... as in attempt N").
        """
        failure = verdict_failure(outcome)
        said = verdict(failure, progressed(outcome.launchers), self._previous, self._previous_number,
                       self.job.restart_on, rank_ends(outcome.launchers)) if failure is not None else (None, None)
        self._previous, self._previous_number = failure, number
        return said

    def attempt_ended(self, number: int, outcome: Outcome, backoff: float | None, repeat: str | None,
                      stopping: str | None) -> None:
        """``attempt_end`` with its verdict and why; ``stop`` before it and ``restart`` after, as
        they apply."""
        if self.events is None:
            return
        # judge() has just read this attempt's failure; read it again only if it was not asked
        failure = self._previous if self._previous_number == number else verdict_failure(outcome)
        code = outcome.exit_code
        cause = (outcome.root.result or {}).get("root_cause") if outcome.root is not None else None
        why = repeat or end_reason(RestartPolicy(self.job.restarts), number, code or None, stopping)
        self.events.attempt_ended(code, attempt_failure(outcome), failure.name() if failure is not None else None,
                                  (cause or {}).get("at") or (outcome.root.failed_at if outcome.root else None),
                                  backoff, why, stopping)

    def close(self, exit_code: int | None) -> None:
        """``run_end`` with the head's exit code (None: the head is leaving on an error, no
        ``run_end``), and the file closed; later calls do nothing."""
        if exit_code is not None:
            self.emit("run_end", exit_code=exit_code)
        if self.events is not None:
            self.events.close()
            self.events = None
