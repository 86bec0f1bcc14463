"""``clusterddp logs k8s``: follow every pod of an object, also the pods it gets later.

A JobSet restart (``failurePolicy.maxRestarts``) deletes its pods and creates new ones under
new names; a PyTorchJob recreates a failed pod. ``kubectl logs -f POD`` ends with its pod, so a
follower that listed the pods once would fall silent at the first restart while the job runs
on. ``Follow`` lists the pods again every ``interval`` seconds and follows each pod whose
container has started (``kubectl logs -f`` of a container still waiting to start fails at
once: ``is waiting to start: ContainerCreating``). It ends when every stream it follows has
ended and the object is finished (a Complete, Completed, Succeeded or Failed condition holds)
or gone; until then it waits for the next pods, saying so once on stderr.

The platform calls (list the pods, read the object, start ``kubectl logs -f``) are handed in,
so this module knows no kubectl argv (clusterddp.schedulers.kubernetes.scheduler does).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO, Callable, Sequence

@dataclass(frozen=True)
class PodState:
    """One pod of a job as ``status`` shows it and the follower picks it up."""

    name: str
    rank: int | None
    phase: str
    #: 'running', 'waiting: ImagePullBackOff', 'terminated: exit 1 (Error)'.
    container: str


#: Condition types that end an object for good (TrainJob: Complete/Failed; JobSet:
#: Completed/Failed; PyTorchJob: Succeeded/Failed).
FINISHED = frozenset({"Complete", "Completed", "Succeeded", "Failed"})
#: Seconds between two listings of the pods while following.
INTERVAL = 1.0


def finished(obj: object) -> bool:
    """True when a condition of FINISHED holds in the object's status (kubectl's JSON; any
    other shape is not finished: the follower keeps waiting, as for a job still running)."""
    status = obj.get("status") if isinstance(obj, dict) else None
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if not isinstance(conditions, list):
        return False
    return any(isinstance(c, dict) and c.get("status") == "True" and c.get("type") in FINISHED for c in conditions)


def started(state: PodState) -> bool:
    """Its container runs or ran: ``kubectl logs -f`` has something to stream."""
    return state.container == "running" or state.container.startswith("terminated")


@dataclass
class Follow:
    """The followers of one object's pods; ``run`` returns the highest ``kubectl logs`` status."""

    #: The pods as they are now (one ``kubectl get pods``).
    list_pods: Callable[[], Sequence[PodState]]
    #: True when the object is finished or gone (its pods will not change any more).
    done: Callable[[], bool]
    #: ``kubectl logs -f POD``, stdout piped.
    start: Callable[[str], subprocess.Popen[bytes]]
    out: IO[str] = sys.stdout
    interval: float = INTERVAL
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)

    def run(self, first: Sequence[PodState]) -> int:
        """Follow ``first`` (the listing the caller already has), then every pod that comes."""
        try:
            self.follow_new(first, announce=False)
            waiting = False
            while True:
                if self.all_ended():
                    if self.done():
                        self.follow_new(self.list_pods(), announce=True)  # one that started and ended in between
                        break
                    if not waiting:
                        self.note("every pod's log has ended, the job has not: waiting for its next pods"
                                  if self.procs else "no pod's container has started yet: waiting for one")
                        waiting = True
                self.wake.wait(self.interval)
                self.wake.clear()
                if self.follow_new(self.list_pods(), announce=True):
                    waiting = False
            codes = [proc.wait() for proc in self.procs.values()]
            for thread in self.threads:
                thread.join()
            return max(codes, default=0)
        finally:
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def all_ended(self) -> bool:
        return all(proc.poll() is not None for proc in self.procs.values())

    def follow_new(self, states: Sequence[PodState], announce: bool) -> int:
        """Start a follower for each started pod not followed yet; returns how many."""
        new = [s for s in states if s.name not in self.procs and started(s)]
        for state in sorted(new, key=lambda s: (s.rank is None, s.rank or 0, s.name)):
            if announce:
                self.note(f"following pod {state.name} ({self.node(state)}), new since the start")
            proc = self.start(state.name)
            self.procs[state.name] = proc
            if proc.stdout is not None:
                thread = threading.Thread(target=self.pump, args=(state, proc.stdout), daemon=True)
                thread.start()
                self.threads.append(thread)
        return len(new)

    @staticmethod
    def node(state: PodState) -> str:
        return f"node {'?' if state.rank is None else state.rank}"

    def pump(self, state: PodState, stream: IO[bytes]) -> None:
        """Copy one pod's lines, each prefixed ``[node R]``; a byte that is not UTF-8 is shown
        escaped and the stream goes on. Wakes the loop when the stream ends."""
        prefix = f"[{self.node(state)}] "
        for line in stream:
            shown_line = line.decode("utf-8", "backslashreplace")
            with self.lock:
                self.out.write(prefix + shown_line)
                self.out.flush()
        self.wake.set()

    def note(self, text: str) -> None:
        with self.lock:
            print(f"clusterddp: {text}", file=sys.stderr, flush=True)
