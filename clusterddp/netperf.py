"""The doctor's numbers: what the bandwidth worker measured, per node, and which node is slow.

Two measurements, because they answer different questions:

- **all_reduce across every rank** (the job's real pattern) gives the cluster's figure,
  reported as nccl-tests does: ``algbw = bytes / time`` and ``busbw = algbw * 2(n-1)/n``
  for all_reduce over n ranks, so numbers compare with nccl-tests and across sizes of cluster.
  It cannot say *which* node is slow: a collective runs at the pace of its slowest link.
- **ping-pong between node pairs** isolates links. The first rank of each node exchanges
  messages with up to ``partners`` other nodes, one round of disjoint pairs at a time
  (round-robin "circle" schedule, so no node is in two pairs at once). A node's figure is
  its *best* partner's: a healthy node paired with a slow one still has a fast partner,
  while a slow node is slow with everyone. That is what pins a throttled host down; with
  only two nodes there is one link and no way to say which end is at fault.

Pure functions on plain data, a leaf: the doctor (launch side, never imports torch) and
its worker (``clusterddp.train.bandwidth``) both use them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

#: A node whose bandwidth is below this fraction of the other nodes' median is flagged.
SLOW_FRACTION = 0.5


def pair_rounds(nnodes: int, limit: int) -> list[list[tuple[int, int]]]:
    """Up to ``limit`` rounds of disjoint node pairs (round-robin circle method).

    Node 0 stays put and the others rotate, so over ``limit`` rounds each node meets
    ``limit`` different partners (``nnodes - 1`` at most); with an odd count one node sits
    out each round.
    """
    nodes: list[int | None] = list(range(nnodes)) + ([None] if nnodes % 2 else [])
    m = len(nodes)
    rounds: list[list[tuple[int, int]]] = []
    for _ in range(m - 1):
        pairs = [(nodes[i], nodes[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        nodes = [nodes[0], nodes[-1], *nodes[1:-1]]
    return [r for r in rounds if r][:limit]


def bus_factor(n: int) -> float:
    """nccl-tests' all_reduce bus bandwidth factor: 2(n-1)/n."""
    return 2 * (n - 1) / n if n > 1 else 1.0


@dataclass(frozen=True)
class PairTiming:
    """One link, one message size: seconds for one message one way (half the round trip)."""

    a: int
    b: int
    size: int
    seconds: float


@dataclass(frozen=True)
class Measurements:
    """Everything the worker's rank 0 reports in its ``CLUSTERDDP_DOCTOR`` line."""

    backend: str
    world_size: int
    nnodes: int
    nproc: int
    hosts: tuple[str, ...]
    allreduce: tuple[tuple[int, float], ...]
    pairs: tuple[PairTiming, ...] = ()

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Measurements":
        return Measurements(
            backend=str(data["backend"]), world_size=int(data["world_size"]), nnodes=int(data["nnodes"]),
            nproc=int(data["nproc"]), hosts=tuple(data["hosts"]),
            allreduce=tuple((int(s), float(t)) for s, t in data["allreduce"]),
            pairs=tuple(PairTiming(int(p["a"]), int(p["b"]), int(p["size"]), float(p["seconds"]))
                        for p in data.get("pairs", ())))

    @property
    def sizes(self) -> list[int]:
        return [size for size, _ in self.allreduce]


@dataclass
class NodeFigures:
    """One node's row: latency, bandwidth per size, and the verdict."""

    node: int
    host: str
    latency: float | None
    algbw: dict[int, float] = field(default_factory=dict)
    best_partner: dict[int, int] = field(default_factory=dict)
    ratio: float | None = None
    slow: bool = False


def node_figures(m: Measurements, slow_fraction: float = SLOW_FRACTION) -> list[NodeFigures]:
    """Per node: best partner's one-way latency (smallest size) and bandwidth per size; the
    node is flagged when its bandwidth at the largest size is below ``slow_fraction`` of
    the median of the other nodes' (needs 3 nodes or more, see the module docstring)."""
    rows = [NodeFigures(node=n, host=m.hosts[n] if n < len(m.hosts) else f"node{n}", latency=None)
            for n in range(m.nnodes)]
    if m.nnodes == 1:
        only = rows[0]
        for size, seconds in m.allreduce:
            only.algbw[size] = size / seconds
        only.latency = m.allreduce[0][1] if m.allreduce else None
        return rows
    for timing in m.pairs:
        for node, partner in ((timing.a, timing.b), (timing.b, timing.a)):
            row = rows[node]
            bandwidth = timing.size / timing.seconds
            if bandwidth > row.algbw.get(timing.size, 0.0):
                row.algbw[timing.size] = bandwidth
                row.best_partner[timing.size] = partner
            if timing.size == min(m.sizes) and (row.latency is None or timing.seconds < row.latency):
                row.latency = timing.seconds
    largest = max(m.sizes)
    for row in rows:
        others = [r.algbw[largest] for r in rows if r is not row and largest in r.algbw]
        if largest in row.algbw and others:
            row.ratio = row.algbw[largest] / statistics.median(others)
            row.slow = m.nnodes >= 3 and row.ratio < slow_fraction
    return rows


def format_size(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def format_rate(bytes_per_second: float) -> str:
    """Decimal units, as nccl-tests (GB/s = 1e9 bytes/s)."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_second >= scale:
            return f"{bytes_per_second / scale:.2f} {unit}"
    return f"{bytes_per_second / 1e3:.2f} kB/s"


def format_time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def allreduce_table(m: Measurements) -> list[str]:
    """nccl-tests style: size, time, algbw, busbw; then the bus bandwidth at the largest size."""
    factor = bus_factor(m.world_size)
    lines = [f"all_reduce across all {m.world_size} ranks ({m.nnodes} node(s) x {m.nproc}, backend {m.backend}); "
             f"busbw = algbw * 2(n-1)/n = algbw * {factor:.2f} (nccl-tests)",
             f"  {'size':>8}  {'time':>10}  {'algbw':>12}  {'busbw':>12}"]
    for size, seconds in m.allreduce:
        algbw = size / seconds
        lines.append(f"  {format_size(size):>8}  {format_time(seconds):>10}  {format_rate(algbw):>12}  "
                     f"{format_rate(algbw * factor):>12}")
    size, seconds = max(m.allreduce)
    lines.append(f"  bus bandwidth: {format_rate(size / seconds * factor)} (all_reduce of {format_size(size)})")
    return lines


def node_table(m: Measurements, rows: Sequence[NodeFigures]) -> list[str]:
    """One row per node; the flag names what is wrong and compared with what."""
    if m.nnodes == 1:
        head = "per node: one node, figures from the all_reduce above (busbw as there)"
    else:
        head = ("per node: ping-pong between each node's first rank and its partner nodes, one round of "
                "disjoint pairs at a time; a node's figure is its best partner's (point-to-point: busbw = algbw)")
    sizes = m.sizes[1:] if len(m.sizes) > 1 else m.sizes  # the smallest one is the latency column
    lines = [head, f"  {'node':>4}  {'host':<16} {'latency':>10}" +
             "".join(f"  {'algbw ' + format_size(s):>16}" for s in sizes) + "  vs others"]
    for row in rows:
        cells = "".join(f"  {format_rate(row.algbw[s]) if s in row.algbw else '-':>16}" for s in sizes)
        latency = format_time(row.latency) if row.latency is not None else "-"
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x" if row.ratio >= 0.1 else f"{row.ratio:.3f}x"
        flag = (f"   <- SLOW: {ratio} the median of the other nodes at {format_size(max(m.sizes))}"
                if row.slow else "")
        lines.append(f"  {row.node:>4}  {row.host:<16} {latency:>10}{cells}  {ratio:>9}{flag}")
    if m.nnodes == 2:
        lines.append("  note: with 2 nodes there is one link; a slow link cannot be pinned to either end")
    return lines
