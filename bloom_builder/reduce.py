"""The reduce step: a key range -> each fingerprint's total count across every run -> the
fingerprints seen at least ``min_count`` times, sorted, in one file per partition.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from bloom_builder.counting import Run, count_range, file_record, files_intact, partition_bounds
from memfree.fileio import atomic_file

KINDS = ("ngrams", "prefixes")


@dataclass(frozen=True)
class ReduceTask:
    """One key range: count across all runs, keep fingerprints seen at least min_count times."""

    index: int
    low: int
    high: int
    runs: tuple[str, ...]
    min_count: int
    max_entries: int
    out_dir: str
    kind: str = "ngrams"

    @property
    def marker(self) -> Path:
        return Path(self.out_dir) / f"{self.kind}-{self.index:05d}.json"

    @property
    def kept_path(self) -> Path:
        return Path(self.out_dir) / f"{self.kind}-{self.index:05d}.u64"

    def outputs_intact(self, result: dict[str, Any]) -> bool:
        """Whether the kept file holds the number of fingerprints the result counted, with the
        bytes (xxh3) it was written with."""
        record = result["kept_file"]
        return int(record[0]) == int(result["kept"]) * 8 and files_intact(
            {str(self.kept_path): record}
        )


@dataclass
class Reduced:
    """The finished reduce tasks and their results.

    Attributes:
        tasks: every reduce task, n-grams first, each kind in partition order.
        results: (kind, partition index) -> the task's result.
    """

    tasks: list[ReduceTask]
    results: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[ReduceTask]:
        """The tasks of one kind ("ngrams" or "prefixes"), in partition order."""
        return [task for task in self.tasks if task.kind == kind]

    def total(self, kind: str, name: str) -> int:
        """A result field (e.g. "kept", "distinct") summed over the tasks of one kind."""
        return sum(int(result[name]) for (of, _), result in self.results.items() if of == kind)

    def seconds(self, name: str = "seconds") -> float:
        """Counting time summed over every task (``"cpu_seconds"``: CPU time of the tasks)."""
        return sum(float(result.get(name, 0.0)) for result in self.results.values())


def reduce_tasks(
    runs: Mapping[str, Sequence[str]],
    num_partitions: int,
    min_count: int,
    max_entries: int,
    out_dir: Path,
) -> list[ReduceTask]:
    """The reduce tasks of every kind that has runs: one per partition, n-grams first.

    Partitions are equal ranges of the 64-bit key space; each task reads only its slice of every
    sorted run (the shuffle is the map step's sorted run files), so tasks run independently.

    Args:
        runs: kind ("ngrams" or "prefixes") -> the stems of every map task's runs of that kind,
            in map-task order; a kind absent is not reduced.
        num_partitions: key ranges (a power of two).
        min_count: keep fingerprints counted at least this many times.
        max_entries: most run entries a task loads at once.
        out_dir: where kept files and markers go (created).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    bounds = partition_bounds(num_partitions)
    return [
        ReduceTask(index, low, high, tuple(runs[kind]), min_count, max_entries, str(out_dir), kind)
        for kind in KINDS
        if kind in runs
        for index, (low, high) in enumerate(bounds)
    ]


def reduce_partition(task: ReduceTask) -> dict[str, Any]:
    """Run one reduce task.

    Returns:
        Its result (the marker's payload): ``distinct`` and ``kept`` fingerprints, ``seconds``
        and ``cpu_seconds``.
    """
    distinct = kept = 0
    digest = xxhash.xxh3_64()
    started, started_cpu = time.perf_counter(), time.thread_time()
    with atomic_file(task.kept_path) as out:
        for fingerprints, counted in count_range(
            [Run(Path(stem)) for stem in task.runs],
            task.low,
            task.high,
            task.min_count,
            task.max_entries,
        ):
            data = fingerprints.astype("<u8").data.cast("B")
            out.write(data)
            digest.update(data)
            distinct += counted.distinct
            kept += counted.kept
    return {
        "distinct": distinct,
        "kept": kept,
        "kept_file": file_record(task.kept_path, digest.hexdigest()),
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.thread_time() - started_cpu,
    }


def read_kept(task: ReduceTask) -> np.ndarray:
    """The kept fingerprints of a finished reduce task (uint64 `(kept,)`, memory-mapped, sorted)."""
    size = task.kept_path.stat().st_size // 8
    if size == 0:
        return np.empty(0, dtype=np.uint64)
    return np.memmap(task.kept_path, dtype="<u8", mode="r", shape=(size,))
