"""Distributed inference output: one shard per rank, merged by rank 0 in data-set order.

Each record is a JSON object carrying the data-set ``index`` it belongs to (use
``IndexedDataset`` to get it). Shards are JSON lines written atomically, so a merge never
reads half a shard; rank 0 merges after every rank has written, sorts by index, drops the
repeats a padding sampler may have produced (identical records only: differing ones mean
a bug and raise), and checks nothing is missing. The output directory must be visible to
rank 0 from every node (a shared filesystem), as the seeds' result files were.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Sequence

from clusterddp.train.atomic import atomic_write
from clusterddp.train.dist import DistContext, all_gather_objects, run_on_main

#: The record field that orders and deduplicates rows.
INDEX_KEY = "index"


def shard_path(out_dir: str | os.PathLike[str], name: str, rank: int) -> Path:
    """``out_dir/name.rank00003.jsonl``: sorts by rank in a directory listing."""
    return Path(out_dir) / f"{name}.rank{rank:05d}.jsonl"


def write_jsonl_atomic(records: Iterable[dict[str, Any]], path: Path) -> Path:
    """JSON lines written atomically: a merge never reads half a shard."""
    def write(f: BinaryIO) -> None:
        for record in records:
            f.write(json.dumps(record, sort_keys=True).encode() + b"\n")

    return atomic_write(path, write)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_shard(records: Sequence[dict[str, Any]], out_dir: str | os.PathLike[str],
                name: str, rank: int) -> Path:
    """This rank's records, each with an integer ``index``."""
    for record in records:
        if not isinstance(record.get(INDEX_KEY), int):
            raise ValueError(f"every record needs an integer {INDEX_KEY!r}; got {record!r:.200}")
    return write_jsonl_atomic(records, shard_path(out_dir, name, rank))


def merge_shards(out_dir: str | os.PathLike[str], name: str, world_size: int,
                 merged_path: str | os.PathLike[str], expected: int | None = None) -> Path:
    """Merge ``world_size`` shards into ``merged_path`` in index order, each index once.

    ``expected``: the data-set size; when given, every index 0..expected-1 must be present.
    """
    shards = [shard_path(out_dir, name, r) for r in range(world_size)]
    missing = [str(p) for p in shards if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of {world_size} result shards are missing ({', '.join(missing[:3])}); "
            "is the output directory on a filesystem every node shares?")
    rows: dict[int, dict[str, Any]] = {}
    for path in shards:
        for record in read_jsonl(path):
            index = record[INDEX_KEY]
            seen = rows.get(index)
            if seen is None:
                rows[index] = record
            elif seen != record:
                raise ValueError(f"index {index} has two different results ({path}): "
                                 f"{seen!r:.200} vs {record!r:.200}")
    if expected is not None:
        absent = sorted(set(range(expected)) - rows.keys())
        extra = sorted(rows.keys() - set(range(expected)))
        if absent or extra:
            raise ValueError(f"merged results do not cover 0..{expected - 1} exactly: "
                             f"{len(absent)} missing (first {absent[:5]}), "
                             f"{len(extra)} unexpected (first {extra[:5]})")
    return write_jsonl_atomic((rows[i] for i in sorted(rows)), Path(merged_path))


def gather_results(records: Sequence[dict[str, Any]], out_dir: str | os.PathLike[str],
                   ctx: DistContext, *, name: str = "results",
                   merged_path: str | os.PathLike[str] | None = None,
                   expected: int | None = None) -> Path:
    """Every rank writes its shard; rank 0 merges them; all ranks return the merged path.

    Collective: every rank must call it. If the merge fails, every rank raises.
    """
    try:
        write_shard(records, out_dir, name, ctx.rank)
        problem = None
    except (OSError, ValueError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    # Doubles as the barrier: nobody merges before every shard is complete, and a rank
    # that failed to write makes all ranks fail now instead of rank 0 waiting forever.
    problems = [(r, p) for r, p in enumerate(all_gather_objects(problem)) if p]
    if problems:
        raise RuntimeError("writing result shards failed on " +
                           "; ".join(f"rank {r}: {p}" for r, p in problems))
    merged = Path(merged_path) if merged_path is not None else Path(out_dir) / f"{name}.jsonl"
    run_on_main(lambda: merge_shards(out_dir, name, ctx.world_size, merged, expected),
                f"merging result shards into {merged}")
    return merged
