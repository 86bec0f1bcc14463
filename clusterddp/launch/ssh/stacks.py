"""The head's part of "where is each rank": ask every host for stacks, wait, merge, report.

A round starts when ``clusterddp stacks`` signals the head (``requested``) or when a host
reports a hang (``hang``: its ``CLUSTERDDP_STACKS`` line with why "hang", or its launcher
exiting with ``exitcodes.HANG``). The head sends ``protocol.STACKS_REQUEST_BYTE`` down every other
live host's stdin and collects one answer per host until all have answered, the host is
gone, or the round's deadline passes. A hang round is short (``HANG_WAIT``): the hung
host is already tearing its workers down, and the others' ranks fail soon after their
peers vanish, so what they are doing must be asked at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterddp.stackreport import HostStacks, MergedStacks, merge

#: Seconds a requested round waits for slow hosts (each host signals and reads its workers).
REQUEST_WAIT = 5.0
#: Seconds a hang round waits for the other hosts before the job is torn down.
HANG_WAIT = 2.0


@dataclass
class StacksRound:
    """One request to every host and the answers so far."""

    why: str
    started: float
    deadline: float
    asked: list[str]
    answers: dict[str, HostStacks] = field(default_factory=dict)
    #: The host whose hang started the round (hang rounds only).
    trigger: str | None = None

    def answer(self, stacks: HostStacks) -> None:
        """Keep the first answer per host (a host may dump again for its own hang)."""
        self.answers.setdefault(stacks.host, stacks)
        if stacks.host not in self.asked:
            self.asked.append(stacks.host)

    def finished(self, now: float, live: set[str]) -> bool:
        """Every asked host answered or is gone, or time is up."""
        waiting = [h for h in self.asked if h not in self.answers and h in live]
        return not waiting or now >= self.deadline

    def merged(self) -> MergedStacks:
        return merge([self.answers[h] for h in self.asked if h in self.answers],
                     missing=[h for h in self.asked if h not in self.answers])

    def title(self, n_hosts: int) -> str:
        ranks = sum(len(a.ranks) for a in self.answers.values())
        cause = f", after a hang on {self.trigger}" if self.trigger else ""
        return f"where each rank is: {ranks} rank(s) on {len(self.answers)} of {n_hosts} host(s) ({self.why}{cause}):"

