"""How this node tells the end of an attempt and of its run: the failure report on the
console, the result line the SSH head reads, the attempt's verdict in the event log, and
launcher.json for ``clusterddp stacks``. The supervisor decides; this only says it."""

from __future__ import annotations

from clusterddp.launch.observe.logs import ConsoleSink
from clusterddp.launch.observe.exits import format_root_cause
from clusterddp.launch.observe.runlog import RunLog
from clusterddp.launch.restart.judge import Judgement
from clusterddp.launch.restart.verdict import rank_ends
from clusterddp.launch.start.workers import WorkerPlan
from clusterddp.launch.supervise.attempt import AttemptResult
from clusterddp.protocol import result_line, write_launcher_file
from clusterddp.topology import Topology


class Telling:
    def __init__(self, job_name: str, console: ConsoleSink, runlog: RunLog, launcher_dir: str | None,
                 result_lines: bool) -> None:
        self.job_name = job_name
        self.console = console
        self.runlog = runlog
        #: Where launcher.json goes; None for a launcher started by the SSH head (--watch-stdin):
        #: the head owns that file, and on a shared filesystem every host would overwrite it.
        self.launcher_dir = launcher_dir
        #: Print the machine-readable result line (``--emit-result``: for the SSH head).
        self.result_lines = result_lines

    def report(self, code: int, result: AttemptResult, reason: str | None) -> None:
        """The closing report: the host, rank, log and last lines of the first failure."""
        report = format_root_cause(self.job_name, result.exits, result.root, reason if code != 0 else None)
        if report:
            self.console.say(report)

    def result_line(self, code: int, host: str, result: AttemptResult, reason: str | None,
                    progressed: bool | None, waiting_after: int | None = None) -> None:
        """This node's end for the SSH head, or (``waiting_after``) an attempt's end while the
        node waits for the head's word."""
        if self.result_lines:
            self.emit(result_line(code, host, result.root.to_json() if result.root else None, reason, progressed,
                                  waiting_after=waiting_after, ranks=[end.to_json() for end in rank_ends(result.exits)]))

    def emit(self, line: str) -> None:
        """A machine-readable line on stdout, for the SSH head."""
        self.console.machine(line)

    def attempt_ended(self, judged: Judgement, result: AttemptResult, stop_reason: str | None) -> None:
        """The attempt's end in the event log: its verdict and why; the restart if one follows."""
        self.runlog.attempt_ended()
        self.runlog.events.attempt_ended(judged.code, result.cause, judged.failure.name() if judged.failure else None,
                                         result.root.at if result.root else None, judged.backoff, judged.why,
                                         stop_reason)

    def launcher_file(self, topology: Topology, plans: list[WorkerPlan]) -> None:
        """logs/<run-id>/launcher.json lets ``clusterddp stacks`` find this launcher."""
        if self.launcher_dir:
            write_launcher_file(self.launcher_dir, topology.host, topology.run_id, [p.rank for p in plans])
