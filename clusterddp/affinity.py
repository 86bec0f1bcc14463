"""Which CPUs each worker may run on: the cores next to its GPU, or a disjoint share.

Why: a worker whose data loading and kernel launches run on the far socket pays a trip over
the socket link for every host-to-GPU copy, and workers that float over the same cores
evict each other's caches. torchrun (torch 2.14) has ``--numa-binding`` with the modes
node, socket, exclusive and core-complex, computed inside the worker with torch; here the
same modes are computed in the launcher from sysfs alone (no torch) and applied with
``sched_setaffinity`` between fork and exec, and CPU-only nodes get disjoint core sets too.

Modes (``cpu_affinity`` in the job file, ``--cpu-affinity`` on the command line):

- ``auto`` (default): ``exclusive`` on GPU nodes; on CPU-only nodes, disjoint shares of the
  launcher's CPUs, whole physical cores first.
- ``exclusive``: the allowed CPUs next to the GPU (its PCI device's ``local_cpulist``, which
  is its NUMA node's CPUs), whole physical cores split evenly between the workers whose GPUs
  share them (torchrun's ``exclusive``).
- ``node``: every allowed CPU next to the GPU (torchrun's ``node``).
- ``socket``: every allowed CPU of the socket(s) of those CPUs.
- ``core-complex``: one last-level-cache group of the CPUs next to the GPU per worker,
  distinct while there are enough groups.
- ``none``: no binding.

A binding is only ever a subset of the launcher's own affinity mask (what SLURM's cgroup or
``taskset`` gave it). When a rule cannot be met (more workers than cores, GPUs without a
known bus id), it falls back to a weaker rule and says so in a note instead of failing.

A worker whose share is one CPU (as many CPUs as workers) stays bound, with a note: torch
sizes a DataLoader by the rank's affinity mask and warns about ``num_workers=2`` there, yet
on 2 CPUs such ranks took a median 0.79x the step time of unbound ones (torchrun's default,
and what "the node's set" is on a CPU node): ``benchmarks/loader_affinity.py``, issue 37.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence, get_args

#: The modes, as the job file's ``cpu_affinity`` is typed (``JobSpec``); ``MODES`` lists them.
Mode = Literal["auto", "exclusive", "node", "socket", "core-complex", "none"]
MODES: tuple[str, ...] = get_args(Mode)


def parse_cpulist(text: str) -> list[int]:
    """sysfs's ``0-3,8,10-11`` as a sorted list; an empty or malformed list is empty."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            start, stop = int(low), int(high or low)
        except ValueError:
            return []
        cpus.update(range(start, stop + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The inverse of ``parse_cpulist``: ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if start is not None and (cpu is None or cpu != prev + 1):  # type: ignore[operator]
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(ranges)


@dataclass(frozen=True)
class CpuTopology:
    """Logical CPUs the launcher may use, and what each shares with which."""

    allowed: tuple[int, ...]
    #: logical cpu -> the lowest cpu of its physical core (hyperthread siblings share one)
    core: Mapping[int, int] = field(default_factory=dict)
    #: logical cpu -> NUMA node
    numa: Mapping[int, int] = field(default_factory=dict)
    #: logical cpu -> socket (physical package)
    socket: Mapping[int, int] = field(default_factory=dict)
    #: logical cpu -> the lowest cpu sharing its last-level cache
    llc: Mapping[int, int] = field(default_factory=dict)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_topology(sysfs: str = "/sys", allowed: Sequence[int] | None = None) -> CpuTopology:
    """The CPU topology from sysfs, restricted to ``allowed`` (default: our affinity mask)."""
    cpus = tuple(sorted(allowed if allowed is not None else os.sched_getaffinity(0)))
    core, numa, socket, llc = {}, {}, {}, {}
    for cpu in cpus:
        base = f"{sysfs}/devices/system/cpu/cpu{cpu}"
        siblings = parse_cpulist(_read(f"{base}/topology/thread_siblings_list") or "")
        core[cpu] = min(siblings) if siblings else cpu
        package = _read(f"{base}/topology/physical_package_id")
        socket[cpu] = int(package) if package and package.lstrip("-").isdigit() else 0
        llc[cpu] = _last_level_cache(base, cpu)
    node_dir = f"{sysfs}/devices/system/node"
    for node in parse_cpulist(_read(f"{node_dir}/online") or _read(f"{node_dir}/possible") or "0"):
        for cpu in parse_cpulist(_read(f"{node_dir}/node{node}/cpulist") or ""):
            if cpu in core:
                numa[cpu] = node
    for cpu in cpus:
        numa.setdefault(cpu, 0)
    return CpuTopology(cpus, core, numa, socket, llc)


def _last_level_cache(base: str, cpu: int) -> int:
    """The lowest cpu sharing this cpu's highest-level cache (its core complex on AMD)."""
    try:
        indexes = [name for name in os.listdir(f"{base}/cache") if name.startswith("index")]
    except OSError:
        return cpu
    best_level, group = -1, cpu
    for name in indexes:
        level = _read(f"{base}/cache/{name}/level")
        shared = parse_cpulist(_read(f"{base}/cache/{name}/shared_cpu_list") or "")
        if level is not None and level.isdigit() and int(level) > best_level and shared:
            best_level, group = int(level), min(shared)
    return group


def gpu_numa_node(pci_address: str | None, sysfs: str = "/sys") -> int | None:
    """The NUMA node a GPU hangs off (``-1``, a one-node machine, means node 0)."""
    if not pci_address:
        return None
    raw = _read(f"{sysfs}/bus/pci/devices/{pci_address}/numa_node")
    if raw is None or not raw.lstrip("-").isdigit():
        return None
    return max(int(raw), 0)


def gpu_local_cpus(pci_address: str | None, sysfs: str = "/sys") -> tuple[int, ...] | None:
    """The CPUs next to a GPU: the device's ``local_cpulist``, else its NUMA node's CPUs."""
    if not pci_address:
        return None
    cpus = parse_cpulist(_read(f"{sysfs}/bus/pci/devices/{pci_address}/local_cpulist") or "")
    if not cpus:
        node = gpu_numa_node(pci_address, sysfs)
        if node is None:
            return None
        cpus = parse_cpulist(_read(f"{sysfs}/devices/system/node/node{node}/cpulist") or "")
    return tuple(cpus) or None


@dataclass(frozen=True)
class Binding:
    """One CPU set per local rank (None: not bound), and why it is what it is."""

    cpus: tuple[tuple[int, ...] | None, ...]
    notes: tuple[str, ...] = ()

    def describe(self, local_rank: int) -> str:
        cpus = self.cpus[local_rank] if local_rank < len(self.cpus) else None
        return "not bound" if cpus is None else format_cpulist(cpus)


#: The note on workers bound to one CPU each: what torch prints in them, and why they stay
#: bound (the figure of ``benchmarks/loader_affinity.py``, 2 ranks on 2 CPUs, two runs of 8
#: rounds: median per-round ratio bound / unbound 0.787 and 0.783; docs/gpu.md).
ONE_CPU_NOTE = ("{who} bound to a single CPU: a DataLoader(num_workers=2) there runs its loader processes "
                "on that CPU too, and torch warns \"This DataLoader will create 2 worker processes in total. "
                "Our suggested max number of worker in current system is 1\"; kept bound, as bound ranks "
                "took a median 0.79x the step time of unbound ones in two runs "
                "(benchmarks/loader_affinity.py, 2 ranks on 2 CPUs); cpu_affinity: none leaves them unbound")


def plan_binding(mode: str, nproc: int, topology: CpuTopology,
                 gpu_cpus: Sequence[tuple[int, ...] | None] = ()) -> Binding:
    """The CPU set of each of ``nproc`` workers; worker i uses GPU i when there are GPUs,
    and ``gpu_cpus[i]`` are the CPUs next to that GPU (``gpu_local_cpus``). Workers left a
    single CPU get ``ONE_CPU_NOTE``, in every mode: torch warns in them, and why they are kept."""
    binding = _plan(mode, nproc, topology, gpu_cpus)
    single = [rank for rank, cpus in enumerate(binding.cpus) if cpus is not None and len(cpus) == 1]
    if not single:
        return binding
    if len(single) == len(binding.cpus):
        who = "every worker is"
    elif len(single) == 1:
        who = f"local rank {single[0]} is"
    else:
        who = f"local ranks {format_cpulist(single)} are"
    return Binding(binding.cpus, binding.notes + (ONE_CPU_NOTE.format(who=who),))


def _plan(mode: str, nproc: int, topology: CpuTopology, gpu_cpus: Sequence[tuple[int, ...] | None]) -> Binding:
    """``plan_binding`` without the one-CPU note: the mode's rule and its fallbacks."""
    if mode not in MODES:
        raise ValueError(f"unknown cpu affinity mode {mode!r}")
    if mode == "none" or nproc < 1 or not topology.allowed:
        return Binding((None,) * max(nproc, 0))
    on_gpus = len(gpu_cpus) >= nproc and all(cpus is not None for cpus in gpu_cpus[:nproc])
    if gpu_cpus and not on_gpus:
        note = "the GPUs' CPUs are unknown (no PCI address from nvidia-smi, or a MIG instance): CPU shares instead"
        return _split(nproc, topology.allowed, topology, (note,))
    if not on_gpus:
        return _split(nproc, topology.allowed, topology, ())
    near = [frozenset(cpus or ()) for cpus in gpu_cpus[:nproc]]
    allowed = set(topology.allowed)
    per_worker: list[tuple[int, ...] | None] = []
    notes: list[str] = []
    for rank, cpus in enumerate(near):
        local = tuple(sorted(cpus & allowed))
        if not local:
            notes.append(f"local rank {rank}: none of its GPU's CPUs ({format_cpulist(cpus)}) is allowed: not bound")
            per_worker.append(None)
            continue
        peers = [r for r, other in enumerate(near) if other == cpus]
        per_worker.append(_on_node(mode, rank, peers, local, topology, notes))
    return Binding(tuple(per_worker), tuple(dict.fromkeys(notes)))


def _on_node(mode: str, rank: int, peers: list[int], local: tuple[int, ...], topology: CpuTopology,
             notes: list[str]) -> tuple[int, ...] | None:
    """One worker's CPUs among ``local`` (those next to its GPU), shared with ``peers``."""
    if mode == "node":
        return local
    if mode == "socket":
        sockets = {topology.socket.get(c, 0) for c in local}
        return tuple(c for c in topology.allowed if topology.socket.get(c, 0) in sockets)
    if mode == "core-complex":
        groups = _groups(local, topology.llc)
        return groups[peers.index(rank) % len(groups)]
    shares = _split(len(peers), local, topology, ())
    notes.extend(shares.notes)
    return shares.cpus[peers.index(rank)]


def _groups(cpus: Sequence[int], key: Mapping[int, int]) -> list[tuple[int, ...]]:
    grouped: dict[int, list[int]] = {}
    for cpu in cpus:
        grouped.setdefault(key.get(cpu, cpu), []).append(cpu)
    return [tuple(sorted(group)) for _, group in sorted(grouped.items())]


def _split(count: int, cpus: Sequence[int], topology: CpuTopology, notes: tuple[str, ...]) -> Binding:
    """``count`` disjoint, contiguous shares: whole physical cores, then logical CPUs."""
    cores = _groups(sorted(cpus, key=lambda c: (topology.numa.get(c, 0), c)), topology.core)
    if len(cores) < count:
        cores = [(cpu,) for cpu in sorted(cpus)]
        if len(cores) < count:
            note = f"{count} workers on {len(cpus)} CPU(s): workers share CPUs, not bound"
            return Binding((None,) * count, notes + (note,))
        notes += (f"{count} workers on {len(_groups(cpus, topology.core))} physical core(s): "
                  "hyperthreads split between workers",)
    base, extra = divmod(len(cores), count)
    shares: list[tuple[int, ...] | None] = []
    start = 0
    for index in range(count):
        stop = start + base + (1 if index < extra else 0)
        shares.append(tuple(sorted(c for core in cores[start:stop] for c in core)))
        start = stop
    return Binding(tuple(shares), notes)
