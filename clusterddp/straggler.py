"""Which host is slow? Each rank's own compute per step, compared with the other ranks'.

In synchronous DDP a slow host (throttled, a noisy neighbour) slows every rank, so the step
time is the same everywhere and says nothing; what differs is the rank's own work outside
collectives (``compute_s`` of its progress file, ``clusterddp.progress``): the slow rank
computes longer, the others wait longer in the all-reduce. So ranks are compared on
``compute_s``; only where no rank measures it, on ``step_s``, which differs between ranks
only when they do not wait for each other (then a slow rank's steps really are longer; in
synchronous DDP the step times are equal and nothing is ever named).

The rule: a rank is slow when its latest record's figure is at least ``THRESHOLD`` times the
median of the other ranks' latest figures, for ``CONFIRM`` records in a row (records come at
most once a second per rank, so a slowdown is named 3-5 s after it began). A record whose
window holds anything but training (a checkpoint, an evaluation, data loading: any phase
announced by the helpers) is left out, as is each rank's first record and any record older
than ``STALE`` seconds than the newest. A host is named once per onset, with its slow ranks
and the median of their ratios; it is named again only after it recovered. A leaf: pure,
fed records by whoever reads them (a node's supervisor, or the SSH head for every host).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from clusterddp.progress import TRAIN, RankProgress
from clusterddp.stackreport import format_ranks

#: A rank this many times the others' median is slow.
THRESHOLD = 1.5
#: Records in a row above the threshold before its host is named (and below before it recovered).
CONFIRM = 3
#: Seconds a rank's latest figure stays comparable after the newest record of any rank.
STALE = 10.0


@dataclass(frozen=True)
class Straggler:
    """One host found slow: its slow ranks and how much slower than the median of the rest."""

    host: str
    ranks: tuple[int, ...]
    ratio: float
    #: "compute" (own work outside collectives) or "time" (whole step, where compute is unknown).
    basis: str

    def line(self) -> str:
        word = "rank" if len(self.ranks) == 1 else "ranks"
        return (f"straggler: host {self.host} ({word} {format_ranks(list(self.ranks))}) "
                f"{self.ratio:.1f}x the median step {self.basis}")


@dataclass
class _Rank:
    seen: tuple[float | None, str, float | None] | None = None
    value: float | None = None
    compute: bool = False
    t: float = 0.0
    streak: int = 0
    calm: int = 0


@dataclass
class StragglerWatch:
    """Fed every rank's latest records; answers the hosts newly found slow."""

    threshold: float = THRESHOLD
    confirm: int = CONFIRM
    _ranks: dict[int, _Rank] = field(default_factory=dict)
    #: Hosts named and not yet recovered.
    _named: set[str] = field(default_factory=set)

    def observe(self, records: Sequence[RankProgress], hosts: Mapping[int, str]) -> list[Straggler]:
        """Take the records (any that changed since the last call count); the hosts to name now."""
        fresh: list[int] = []
        for record in records:
            state = self._ranks.setdefault(record.rank, _Rank())
            key = (record.t, record.phase, record.phase_t)
            if key == state.seen:
                continue
            previous, state.seen = state.seen, key
            state.value = None
            if (previous is None or record.phase != TRAIN or previous[1] != TRAIN or record.steps == 0
                    or record.t is None or (record.phase_t or 0.0) > (previous[0] or 0.0)):
                continue  # a first record, or a window that held something else than training
            state.compute = record.compute_s is not None
            state.value = record.compute_s if state.compute else record.step_s
            state.t = record.t
            fresh.append(record.rank)
        if not fresh:
            return []
        newest = max(state.t for state in self._ranks.values())
        usable = {rank: state for rank, state in self._ranks.items()
                  if state.value is not None and newest - state.t <= STALE}
        compute = any(state.compute for state in usable.values())
        usable = {rank: state for rank, state in usable.items() if state.compute == compute}
        ratios: dict[int, float] = {}
        for rank in fresh:
            mine = usable.get(rank)
            others = [s.value for r, s in usable.items() if r != rank and s.value is not None]
            if mine is None or mine.value is None or not others:
                continue
            base = statistics.median(others)
            ratio = mine.value / base if base > 0 else 0.0
            if ratio >= self.threshold:
                mine.streak, mine.calm = mine.streak + 1, 0
                ratios[rank] = ratio
            else:
                mine.streak, mine.calm = 0, mine.calm + 1
        return self._name(ratios, hosts, "compute" if compute else "time")

    def _name(self, ratios: dict[int, float], hosts: Mapping[int, str], basis: str) -> list[Straggler]:
        slow: dict[str, list[int]] = {}
        for rank, state in self._ranks.items():
            if state.streak >= self.confirm:
                slow.setdefault(hosts.get(rank, "?"), []).append(rank)
        for host in list(self._named):
            ranks = [r for r, h in hosts.items() if h == host and r in self._ranks]
            if host not in slow and all(self._ranks[r].calm >= self.confirm for r in ranks):
                self._named.discard(host)
        found = []
        for host, ranks in sorted(slow.items()):
            if host in self._named:
                continue
            known = [ratios[r] for r in ranks if r in ratios]
            if not known:
                continue
            self._named.add(host)
            found.append(Straggler(host, tuple(sorted(ranks)), statistics.median(known), basis))
        return found
