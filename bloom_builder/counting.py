"""Exact n-gram counting in bounded memory: sorted runs spilled to disk by the map step, merged
per key range by the reduce step (a range too large for the memory limit is cut into parts).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memfree.fileio import atomic_write

KEY_BYTES = 8
COUNT_BYTES = 4
RUN_ENTRY_BYTES = KEY_BYTES + COUNT_BYTES


def _write_array(path: Path, array: np.ndarray) -> None:
    """Write an array's bytes to ``path`` atomically: a run file is complete or absent."""
    atomic_write(path, [np.ascontiguousarray(array).data.cast("B")])


@dataclass(frozen=True)
class Run:
    """One spilled run: ``<stem>.keys`` (sorted distinct uint64) and ``<stem>.counts`` (uint32)."""

    stem: Path

    @property
    def keys_path(self) -> Path:
        return self.stem.with_suffix(".keys")

    @property
    def counts_path(self) -> Path:
        return self.stem.with_suffix(".counts")

    def open(self) -> tuple[np.ndarray, np.ndarray]:
        """Memory-map the run's keys and counts (empty arrays for an empty run)."""
        size = self.keys_path.stat().st_size // KEY_BYTES
        if size == 0:
            return np.empty(0, np.uint64), np.empty(0, np.uint32)
        keys = np.memmap(self.keys_path, dtype="<u8", mode="r", shape=(size,))
        counts = np.memmap(self.counts_path, dtype="<u4", mode="r", shape=(size,))
        return keys, counts


class RunWriter:
    """Buffers fingerprints and spills them as sorted, counted runs.

    Whenever the buffer reaches its limit, one *run* is written: the sorted distinct
    fingerprints and their counts. :func:`count_range` later adds up the counts of every
    fingerprint in a key range across all runs; each run is sorted, so a range is a slice.

    Args:
        directory: where the runs go (created).
        buffer_entries: fingerprints held in memory before a spill.
    """

    def __init__(self, directory: Path, buffer_entries: int) -> None:
        if buffer_entries < 1:
            raise ValueError(f"buffer_entries must be >= 1, got {buffer_entries}")
        self.directory = directory
        self.buffer_entries = buffer_entries
        self._pending: list[np.ndarray] = []
        self._pending_entries = 0
        self.runs: list[Run] = []
        directory.mkdir(parents=True, exist_ok=True)

    def add(self, fingerprints: np.ndarray) -> None:
        """Queue fingerprints (uint64 `(N,)`), spilling when the buffer is full."""
        if fingerprints.size == 0:
            return
        self._pending.append(fingerprints)
        self._pending_entries += fingerprints.size
        if self._pending_entries >= self.buffer_entries:
            self.spill()

    def spill(self) -> None:
        """Write the buffered fingerprints as one run (no-op when empty)."""
        if not self._pending:
            return
        keys, counts = _sorted_counts(np.concatenate(self._pending))
        self._pending, self._pending_entries = [], 0
        run = Run(self.directory / f"run-{len(self.runs):05d}")
        _write_array(run.keys_path, keys.astype("<u8"))
        _write_array(run.counts_path, np.minimum(counts, np.iinfo(np.uint32).max).astype("<u4"))
        self.runs.append(run)

    def close(self) -> list[Run]:
        """Spill what is left; return every run written."""
        self.spill()
        return self.runs


def _slice(keys: np.ndarray, low: int, high: int) -> slice:
    """Index slice of sorted ``keys`` within [low, high) (high may be 2**64)."""
    begin = int(np.searchsorted(keys, np.uint64(low), side="left"))
    end = keys.shape[0] if high >= 1 << 64 else int(np.searchsorted(keys, np.uint64(high), "left"))
    return slice(begin, end)


@dataclass
class RangeCount:
    """What counting a key range found."""

    distinct: int = 0
    kept: int = 0


def count_range(
    runs: Sequence[Run],
    low: int,
    high: int,
    min_count: int,
    max_entries: int,
) -> Iterator[tuple[np.ndarray, RangeCount]]:
    """Yield the kept fingerprints of [low, high) in ascending order, sub-range by sub-range.

    Args:
        runs: every run of every map task.
        low: first key of the range.
        high: one past the last key (up to 2**64).
        min_count: keep fingerprints whose total count is at least this.
        max_entries: most run entries loaded at once; larger ranges are cut into 16 parts.

    Yields:
        (sorted kept uint64 fingerprints, counts of distinct and kept for that sub-range).
    """
    opened = [run.open() for run in runs]
    yield from _count(opened, low, high, min_count, max_entries)


def _count(
    opened: list[tuple[np.ndarray, np.ndarray]],
    low: int,
    high: int,
    min_count: int,
    max_entries: int,
) -> Iterator[tuple[np.ndarray, RangeCount]]:
    slices = [_slice(keys, low, high) for keys, _ in opened]
    total = sum(s.stop - s.start for s in slices)
    if total > max_entries and high - low > 16:
        step = (high - low) // 16
        for part in range(16):
            part_low = low + part * step
            part_high = high if part == 15 else part_low + step
            yield from _count(opened, part_low, part_high, min_count, max_entries)
        return
    if total == 0:
        yield np.empty(0, np.uint64), RangeCount()
        return
    keys = np.concatenate([opened[i][0][s] for i, s in enumerate(slices)])
    if min_count <= 1:
        distinct = _sorted_distinct(keys)
        yield distinct, RangeCount(distinct=distinct.size, kept=distinct.size)
        return
    counts = np.concatenate([opened[i][1][s] for i, s in enumerate(slices)]).astype(np.uint64)
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    totals = np.add.reduceat(counts, starts)
    kept = keys[starts][totals >= min_count]
    yield kept, RangeCount(distinct=starts.size, kept=kept.size)


def _sorted_distinct(keys: np.ndarray) -> np.ndarray:
    """The distinct values of ``keys`` (uint64 `(N,)`, sorted in place), ascending.

    Same result as ``np.unique(keys)``, which numpy 2.x answers through a hash table when no
    counts are asked for: measured 0.8M keys/s there against 30M keys/s for this sort and mask
    (4M uint64 keys).
    """
    keys.sort()
    if keys.size == 0:
        return keys
    first = np.empty(keys.size, dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    return keys[first]


def _sorted_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``keys`` (uint64 `(N,)`, sorted in place) and how often each
    occurs: ``np.unique(keys, return_counts=True)``, which measured 16M keys/s here against
    about 50M/s for this sort and mask (5M uint64 keys)."""
    keys.sort()
    if keys.size == 0:
        return keys, np.empty(0, dtype=np.intp)
    first = np.empty(keys.size, dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return keys[starts], np.diff(starts, append=keys.size)


def partition_bounds(num_partitions: int) -> list[tuple[int, int]]:
    """Equal key ranges [low, high) covering 0..2**64, one per partition (a power of two)."""
    if num_partitions < 1 or num_partitions & (num_partitions - 1):
        raise ValueError(f"num_partitions must be a power of two, got {num_partitions}")
    width = (1 << 64) // num_partitions
    return [(index * width, (index + 1) * width) for index in range(num_partitions)]
