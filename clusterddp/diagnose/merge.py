"""Where each rank is across hosts: merge every host's stack summaries into one report.

Each remote launcher answers a stacks request with one ``CLUSTERDDP_STACKS`` line: its host,
why it dumped ("requested" or "hang"), one summary per rank and where it kept the full dump.
The head merges those answers by identical summary, so 64 ranks on 8 hosts read as
"ranks 0-6,8-63 (node1..node8): in all_reduce ..." and "rank 7 (node1): in load_batch ...".
The same rule as on one host picks the likely culprit: a rank outside any collective while
others wait in one. Pure functions, no I/O: the relay feeds them and prints the result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from clusterddp.diagnose.stacks import COLLECTIVES, format_ranks

#: The innermost frame as ``locate`` writes it: "in all_reduce (distributed_c10d.py:2850) ...".
_INNERMOST = re.compile(r"^in (?P<func>[^ ]+) \((?P<file>[^:)]+):\d+\)")
_LIBRARY_FILES = ("distributed_c10d.py", "c10d_logger.py", "distributed.py")


def summary_in_collective(summary: str) -> bool:
    """Whether a one-line summary says the rank waits inside a torch.distributed collective.

    Used when a host's answer does not list its waiting ranks itself: the summary's
    innermost frame is a collective function of torch.distributed's own files.
    """
    match = _INNERMOST.match(summary)
    return match is not None and match.group("func") in COLLECTIVES and match.group("file") in _LIBRARY_FILES


@dataclass(frozen=True)
class HostStacks:
    """One host's answer to a stacks request."""

    host: str
    why: str
    ranks: Mapping[int, str]
    waiting: frozenset[int]
    full: str | None = None

    @staticmethod
    def from_json(data: Mapping[str, Any], host: str) -> "HostStacks":
        """From a ``CLUSTERDDP_STACKS`` payload; ``host`` is the head's name for the host.

        ``waiting`` (ranks inside a collective) is used when the launcher sends it, else it
        is read off each summary.
        """
        ranks = {int(rank): str(summary) for rank, summary in (data.get("ranks") or {}).items()}
        if isinstance(data.get("waiting"), list):
            waiting = frozenset(int(r) for r in data["waiting"])
        else:
            waiting = frozenset(r for r, s in ranks.items() if summary_in_collective(s))
        return HostStacks(host=host, why=str(data.get("why", "requested")), ranks=ranks, waiting=waiting,
                          full=data.get("full"))


@dataclass
class MergedStacks:
    """Every answering host's ranks, grouped; plus the hosts that did not answer."""

    answers: list[HostStacks]
    missing: list[str] = field(default_factory=list)

    @property
    def where(self) -> dict[int, tuple[str, str]]:
        """rank -> (host, summary)."""
        return {rank: (a.host, summary) for a in self.answers for rank, summary in a.ranks.items()}

    @property
    def waiting(self) -> set[int]:
        return {rank for a in self.answers for rank in a.waiting}

    def suspects(self) -> list[int]:
        """Ranks outside any collective while others wait in one (empty if nobody waits)."""
        waiting = self.waiting
        if not waiting:
            return []
        return sorted(rank for rank in self.where if rank not in waiting)

    def lines(self) -> list[str]:
        """One line per distinct summary, odd ones out first, each naming its ranks and hosts."""
        where = self.where
        waiting = self.waiting
        groups: dict[str, list[int]] = {}
        for rank, (_, summary) in where.items():
            groups.setdefault(summary, []).append(rank)
        ordered = sorted(groups.items(), key=lambda kv: (kv[1][0] in waiting, min(kv[1])))
        lines = []
        for summary, ranks in ordered:
            hosts = sorted({where[r][0] for r in ranks}, key=lambda h: min(r for r in ranks if where[r][0] == h))
            label = "rank" if len(ranks) == 1 else "ranks"
            flag = "" if ranks[0] in waiting or not waiting else "   <- not in a collective: likely holding the others"
            lines.append(f"{label} {format_ranks(ranks)} ({', '.join(hosts)}): {summary}{flag}")
        lines.extend(f"{host}: no answer (its launcher had exited or did not reply in time)" for host in self.missing)
        return lines

    def culprit(self) -> str:
        """The hang message's verdict: who holds the others, or that nobody stands out."""
        suspects = self.suspects()
        if suspects:
            hosts = sorted({self.where[r][0] for r in suspects})
            return (f"rank(s) {format_ranks(suspects)} on {', '.join(hosts)} not in a collective while "
                    f"rank(s) {format_ranks(sorted(self.waiting))} wait in one")
        if not self.where:
            return "no stacks received"
        return "every rank is in the same kind of place; see the stacks"

    def text(self, title: str) -> str:
        """The report as written to ``stacks-*.txt``: summary, then each host's full dump."""
        out = [title] + [f"  {line}" for line in self.lines()]
        out.append("full dumps (all threads), kept on each host:")
        out.extend(f"  {a.host}: {a.full or '(not written)'}" for a in sorted(self.answers, key=_first_rank))
        return "\n".join(out) + "\n"


def _first_rank(answer: HostStacks) -> int:
    return min(answer.ranks, default=1 << 30)


def merge(answers: Sequence[HostStacks], missing: Sequence[str] = ()) -> MergedStacks:
    return MergedStacks(answers=list(answers), missing=list(missing))
