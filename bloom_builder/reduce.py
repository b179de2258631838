"""The reduce step: a key range -> each fingerprint's total count across every run -> the
fingerprints seen at least ``min_count`` times, sorted, in one file per partition; each task's
counts come back as a typed :class:`ReduceResult`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import xxhash

from bloom_builder.counting import (
    FileRecord,
    Run,
    count_range,
    file_record,
    files_intact,
    partition_bounds,
)
from memfree.fileio import atomic_file

#: What a reduce task counts: the n-grams' fingerprints, or their (n-1)-prefixes' (prefix section).
RunKind = Literal["ngrams", "prefixes"]
KINDS: tuple[RunKind, ...] = get_args(RunKind)


@dataclass(frozen=True)
class ReduceResult:
    """What a reduce task counted and kept; its marker holds :meth:`to_json`.

    Attributes:
        distinct: distinct fingerprints in its key range.
        kept: those seen at least ``min_count`` times (written to its kept file).
        kept_file: the record (size, xxh3, times) of its kept file.
        seconds: wall time of the count.
        cpu_seconds: CPU time of the count, in the task's thread.
        reused: the result comes from the marker of an earlier build, not from running.
        histogram: kept keys by their top 12 bits, over the partition's range (the
            prefix-keyed index sizes its sections from it).
    """

    distinct: int
    kept: int
    kept_file: FileRecord
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    reused: bool = False
    histogram: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The marker's payload: ``distinct``, ``kept``, ``kept_file``, the times, ``reused``."""
        return {
            "distinct": self.distinct,
            "kept": self.kept,
            "kept_file": self.kept_file.to_json(),
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "reused": self.reused,
            # Only written when counted (markers of earlier builds have none).
            **({"histogram": list(self.histogram)} if self.histogram else {}),
        }

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> ReduceResult:
        """Read a marker's payload back (times it lacks are 0).

        Raises:
            KeyError, TypeError, ValueError: the payload is not a reduce task's (the task reruns).
        """
        return cls(
            distinct=int(payload["distinct"]),
            kept=int(payload["kept"]),
            kept_file=FileRecord.from_json(payload["kept_file"]),
            seconds=float(payload.get("seconds", 0.0)),
            cpu_seconds=float(payload.get("cpu_seconds", 0.0)),
            reused=bool(payload.get("reused", False)),
            histogram=tuple(int(count) for count in payload.get("histogram", ())),
        )


#: The top bits of a key that :attr:`ReduceResult.histogram` counts by.
HISTOGRAM_BITS = 12


@dataclass(frozen=True, kw_only=True)
class ReduceTask:
    """One key range: count across all runs, keep fingerprints seen at least min_count times.

    Attributes:
        index: the partition's index (names its kept file and marker).
        low: first key of the range.
        high: one past its last key (up to 2**64).
        runs: the stems of every map task's runs of this kind, in map-task order.
        min_count: keep fingerprints counted at least this many times.
        max_entries: most run entries loaded at once.
        out_dir: where the kept file and the marker go.
        kind: "ngrams" or "prefixes".
        histogram: also count the kept keys by their top bits (for the prefix-keyed index).
    """

    result_type: ClassVar[type[ReduceResult]] = ReduceResult

    index: int
    low: int
    high: int
    runs: tuple[str, ...]
    min_count: int
    max_entries: int
    out_dir: str
    kind: RunKind = "ngrams"
    histogram: bool = False

    @property
    def marker(self) -> Path:
        return Path(self.out_dir) / f"{self.kind}-{self.index:05d}.json"

    @property
    def kept_path(self) -> Path:
        return Path(self.out_dir) / f"{self.kind}-{self.index:05d}.u64"

    def output_sizes(self, result: ReduceResult) -> dict[str, int]:
        """The file the task wrote, its kept keys, and its size."""
        return {str(self.kept_path): result.kept_file.size_bytes}

    def outputs_intact(self, result: ReduceResult) -> bool:
        """Whether the kept file holds the number of fingerprints the result counted, with the
        bytes (xxh3) it was written with."""
        record = result.kept_file
        return record.size_bytes == result.kept * 8 and files_intact({str(self.kept_path): record})


@dataclass
class Reduced:
    """The finished reduce tasks and their results.

    Attributes:
        tasks: every reduce task, n-grams first, each kind in partition order.
        results: (kind, partition index) -> the task's result.
    """

    tasks: list[ReduceTask]
    results: dict[tuple[RunKind, int], ReduceResult] = field(default_factory=dict)

    def of_kind(self, kind: RunKind) -> list[ReduceTask]:
        """The tasks of one kind ("ngrams" or "prefixes"), in partition order."""
        return [task for task in self.tasks if task.kind == kind]

    def kept(self, kind: RunKind) -> int:
        """Fingerprints kept by the tasks of one kind."""
        return sum(result.kept for (of, _), result in self.results.items() if of == kind)

    def distinct(self, kind: RunKind) -> int:
        """Distinct fingerprints counted by the tasks of one kind."""
        return sum(result.distinct for (of, _), result in self.results.items() if of == kind)

    def seconds(self) -> float:
        """Counting (wall) time summed over every task."""
        return sum(result.seconds for result in self.results.values())

    def cpu_seconds(self) -> float:
        """Counting CPU time summed over every task."""
        return sum(result.cpu_seconds for result in self.results.values())


def reduce_tasks(
    runs: Mapping[RunKind, Sequence[str]],
    num_partitions: int,
    min_count: int,
    max_entries: int,
    out_dir: Path,
    histogram: bool = False,
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
        histogram: count each partition's kept keys by their top bits (the index's sections).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    bounds = partition_bounds(num_partitions)
    return [
        ReduceTask(
            index=index,
            low=low,
            high=high,
            runs=tuple(runs[kind]),
            min_count=min_count,
            max_entries=max_entries,
            out_dir=str(out_dir),
            kind=kind,
            histogram=histogram,
        )
        for kind in KINDS
        if kind in runs
        for index, (low, high) in enumerate(bounds)
    ]


def reduce_partition(task: ReduceTask) -> ReduceResult:
    """Run one reduce task: count its key range across every run, write what it keeps.

    Returns:
        The fingerprints it counted and kept, the record of its kept file, and its times.
    """
    distinct = kept = 0
    first_bin = task.low >> (64 - HISTOGRAM_BITS)
    histogram = np.zeros(max(1, (task.high - task.low) >> (64 - HISTOGRAM_BITS)), dtype=np.int64)
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
            if task.histogram:
                bins = (fingerprints >> np.uint64(64 - HISTOGRAM_BITS)).astype(np.int64)
                histogram += np.bincount(bins - first_bin, minlength=histogram.size)
            out.write(data)
            digest.update(data)
            distinct += counted.distinct
            kept += counted.kept
    return ReduceResult(
        distinct=distinct,
        kept=kept,
        kept_file=file_record(task.kept_path, digest.hexdigest()),
        seconds=time.perf_counter() - started,
        cpu_seconds=time.thread_time() - started_cpu,
        histogram=tuple(histogram.tolist()) if task.histogram else (),
    )


def read_kept(task: ReduceTask) -> np.ndarray:
    """The kept fingerprints of a finished reduce task (uint64 `(kept,)`, memory-mapped, sorted)."""
    size = task.kept_path.stat().st_size // 8
    if size == 0:
        return np.empty(0, dtype=np.uint64)
    return np.memmap(task.kept_path, dtype="<u8", mode="r", shape=(size,))
