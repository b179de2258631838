"""Exact n-gram counting in bounded memory: sorted runs spilled to disk by the map step, merged
per key range by the reduce step (a range too large for the memory limit is cut into parts); and
the records (size, xxh3, times) by which a resumed build trusts the files a task wrote.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from memfree.fileio import fsync_directory

KEY_BYTES = 8
RUN_ENTRY_BYTES = 12  # a key, and room for repeats: what the memory budget plans per entry


def _write_array(path: Path, array: np.ndarray) -> FileRecord:
    """Write an array's bytes to a temporary beside ``path`` and rename it into place (a run
    file is complete or absent); :class:`RunWriter` makes it durable later, off the hot path.

    Returns:
        What a task's marker records of the file (:func:`file_record`), so that a run damaged
        later is never reused.
    """
    temporary = path.with_name(f".{path.name}.tmp")
    data = np.ascontiguousarray(array).data.cast("B")
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)
    return file_record(path, xxhash.xxh3_64_hexdigest(data))


@dataclass(frozen=True)
class FileRecord:
    """What a task's marker records of a file the task wrote, so that a resumed build can tell
    the file is intact (:func:`files_intact`); in the marker, ``[size, xxh3, mtime_ns, ctime_ns]``.

    Attributes:
        size_bytes: the file's size when written.
        xxh3: the xxh3 (hex) of its bytes.
        times_ns: its modification and status-change times when written (``()``: unknown, so
            the file is always read and hashed).
    """

    size_bytes: int
    xxh3: str
    times_ns: tuple[int, ...] = ()

    def to_json(self) -> list[Any]:
        """The marker's list: ``[size, xxh3, mtime_ns, ctime_ns]``."""
        return [self.size_bytes, self.xxh3, *self.times_ns]

    @classmethod
    def from_json(cls, entry: Sequence[Any]) -> FileRecord:
        """Read a marker's list back (a list of size and xxh3 alone has no times)."""
        return cls(int(entry[0]), str(entry[1]), tuple(entry[2:]))


def file_record(path: Path, digest: str) -> FileRecord:
    """The record of a file just written whose bytes hash to ``digest``: its size and times.

    The times let a resumed build trust an untouched file without reading it: any write changes
    the status-change time (ctime), which no user command can set back. A file whose times moved
    (``touch``, a copied work directory) is read and hashed instead."""
    info = path.stat()
    return FileRecord(info.st_size, digest, (info.st_mtime_ns, info.st_ctime_ns))


def file_digest(path: Path, chunk_bytes: int = 16 << 20) -> tuple[int, str]:
    """The size in bytes and the xxh3 of a file's bytes, read in chunks (bounded memory)."""
    digest = xxhash.xxh3_64()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def files_intact(recorded: Mapping[str, FileRecord]) -> bool:
    """Whether every file recorded by :func:`file_record` (path -> record) still has its recorded
    size and bytes.

    A file with its recorded size and times is trusted unread (a resume must not read every
    intermediate file again: runs take about 8 bytes per n-gram); a changed size fails at once;
    any other file is hashed and compared."""
    for name, record in recorded.items():
        path = Path(name)
        try:
            info = path.stat()
            if info.st_size != record.size_bytes:
                return False
            if list(record.times_ns) == [info.st_mtime_ns, info.st_ctime_ns]:
                continue
            if file_digest(path) != (record.size_bytes, record.xxh3):
                return False
        except OSError:
            return False
    return True


def _fsync(path: Path) -> None:
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


@dataclass(frozen=True)
class Run:
    """One spilled run: ``<stem>.keys``, its sorted distinct fingerprints (uint64), and
    ``<stem>.repeats``, the few of them seen more than once in the run: their indices into the
    keys, then their counts (uint64 each, indices ascending). Every other key was seen once, so
    a run costs 8 bytes per key on disk rather than 12 with a count per key."""

    stem: Path

    @property
    def keys_path(self) -> Path:
        return self.stem.with_suffix(".keys")

    @property
    def repeats_path(self) -> Path:
        return self.stem.with_suffix(".repeats")

    def open(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Memory-map the run: its keys uint64 `(K,)`, and the indices uint64 `(R,)` and counts
        uint64 `(R,)` of its repeated keys (empty arrays where there are none)."""
        return _map_array(self.keys_path), *_map_halves(self.repeats_path)

    def slice_of(self, low: int, high: int) -> slice:
        """Index slice of the run's keys within [low, high) (high may be 2**64).

        The map is opened for the binary search and closed at once: a reduce task meets every
        run of the build (tens of thousands at corpus scale), more than a process may keep
        open as files or maps."""
        return _slice(_map_array(self.keys_path), low, high)

    def read(self, part: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The run's keys in ``part`` uint64, and the positions int64 (within ``part``) and
        counts uint64 of its repeated keys there.

        Keys are read from the file, not through a map: pages read through a map stay in the
        process's resident memory until it is closed."""
        keys = np.fromfile(
            self.keys_path, dtype="<u8", count=part.stop - part.start, offset=part.start * KEY_BYTES
        )
        repeated, counts = _map_halves(self.repeats_path)
        bounds = np.array([part.start, part.stop], dtype=np.uint64)
        begin, end = np.searchsorted(repeated, bounds)
        where = np.array(repeated[begin:end], dtype=np.int64) - part.start
        return keys, where, np.array(counts[begin:end], dtype=np.uint64)


def _map_array(path: Path) -> np.ndarray:
    """The little-endian uint64 array in ``path`` (an empty array for an empty file)."""
    size = path.stat().st_size // KEY_BYTES
    if size == 0:
        return np.empty(0, np.uint64)
    return np.memmap(path, dtype="<u8", mode="r", shape=(size,))


def _map_halves(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The two equal uint64 arrays stored one after the other in ``path``."""
    both = _map_array(path)
    half = both.shape[0] // 2
    return both[:half], both[half:]


class RunWriter:
    """Buffers fingerprints and spills them as sorted, counted runs.

    Whenever the buffer reaches its limit, one *run* is written: the sorted distinct
    fingerprints and their counts. :func:`count_range` later adds up the counts of every
    fingerprint in a key range across all runs; each run is sorted, so a range is a slice.

    Runs are flushed to disk by a background thread while the task goes on hashing (an fsync
    per spill measured about as long as the hashing itself on this machine's disk);
    :meth:`close` waits for every flush, so a task that returns (and gets its marker) has
    its runs on disk.

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
        self.files: dict[str, FileRecord] = {}  # every run file -> its record
        self._flusher: ThreadPoolExecutor | None = None
        self._flushes: list[Future[None]] = []
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
        keys = np.concatenate(self._pending)
        self._pending, self._pending_entries = [], 0
        keys.sort()
        keys, repeated, counts = _distinct_repeats(keys)
        run = Run(self.directory / f"run-{len(self.runs):05d}")
        self.files[str(run.keys_path)] = _write_array(run.keys_path, keys.astype("<u8", copy=False))
        self.files[str(run.repeats_path)] = _write_array(
            run.repeats_path, np.concatenate((repeated, counts)).astype("<u8")
        )
        self.runs.append(run)
        if self._flusher is None:
            self._flusher = ThreadPoolExecutor(1, thread_name_prefix="memfree-fsync")
        for path in (run.keys_path, run.repeats_path):
            self._flushes.append(self._flusher.submit(_fsync, path))

    def close(self) -> list[Run]:
        """Spill what is left, wait until every run is on disk; return every run written."""
        self.spill()
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)
            self._flusher = None
            flushes, self._flushes = self._flushes, []
            for flush in flushes:
                flush.result()  # an fsync error fails the task (it is retried or reported)
            fsync_directory(self.directory)
        return self.runs


def _slice(keys: np.ndarray, low: int, high: int) -> slice:
    """Index slice of sorted ``keys`` within [low, high) (high may be 2**64)."""
    if low >= 1 << 64:
        return slice(keys.shape[0], keys.shape[0])
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
    yield from _count(list(runs), low, high, min_count, max_entries)


def _count(
    runs: list[Run],
    low: int,
    high: int,
    min_count: int,
    max_entries: int,
) -> Iterator[tuple[np.ndarray, RangeCount]]:
    slices = [run.slice_of(low, high) for run in runs]
    total = sum(s.stop - s.start for s in slices)
    if total > max_entries and high - low > 16:
        step = (high - low) // 16
        for part in range(16):
            part_low = low + part * step
            part_high = high if part == 15 else part_low + step
            yield from _count(runs, part_low, part_high, min_count, max_entries)
        return
    if total == 0:
        yield np.empty(0, np.uint64), RangeCount()
        return
    # Each run's keys in the range, with the positions (in that slice) and counts of the ones
    # the run saw more than once.
    parts = [run.read(s) for run, s in zip(runs, slices, strict=True) if s.stop > s.start]
    if len(parts) == 1:  # one run's slice: already sorted, distinct and counted
        keys, where, counts = parts[0]
        kept = keys if min_count <= 1 else keys[where[counts >= min_count]]
        yield kept, RangeCount(distinct=keys.shape[0], kept=kept.size)
        return
    keys = np.concatenate([keys for keys, _, _ in parts])
    keys.sort(kind="stable")  # a merge of sorted runs: timsort finds them (2-3x quicksort here)
    distinct, repeated, counts = _distinct_repeats(keys)
    if min_count <= 1:
        yield distinct, RangeCount(distinct=distinct.size, kept=distinct.size)
        return
    # A key's total is 1, plus one per further run holding it, plus, for an entry its run
    # counted more than once, the rest of that count. With min_count >= 2 only keys with
    # something beyond the 1 can be kept: everything below is over those few keys.
    positions = [repeated.astype(np.int64)]
    extras = [counts - np.uint64(1)]
    for run_keys, where, run_counts in parts:
        if where.size:
            positions.append(np.searchsorted(distinct, run_keys[where]))
            extras.append(run_counts - np.uint64(1))
    position = np.concatenate(positions)
    extra = np.concatenate(extras)
    kept = distinct[:0]
    if position.size:
        order = np.argsort(position, kind="stable")
        position, extra = position[order], extra[order]
        starts = np.flatnonzero(np.concatenate(([True], position[1:] != position[:-1])))
        totals = np.add.reduceat(extra, starts) + np.uint64(1)
        kept = distinct[position[starts][totals >= min_count]]
    yield kept, RangeCount(distinct=distinct.size, kept=kept.size)


def _distinct_repeats(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct values of sorted ``keys`` (uint64 `(N,)`), and which of them occur more than
    once, with how often: ``np.unique(keys, return_counts=True)`` in sparse form.

    Only the duplicates are looked at after one comparison pass (long n-grams are mostly
    distinct), where ``np.unique`` measured 16M keys/s here and, without counts, 0.8M keys/s
    (numpy 2.x answers that through a hash table).

    Returns:
        (distinct uint64 `(D,)` ascending, repeated int64 `(R,)` ascending indices into
        ``distinct`` of the values seen more than once, counts uint64 `(R,)` of those).
    """
    empty = np.empty(0, dtype=np.int64)
    if keys.size < 2:
        return keys, empty, empty.astype(np.uint64)
    again = np.empty(keys.size, dtype=bool)
    again[0] = False
    np.equal(keys[1:], keys[:-1], out=again[1:])
    duplicates = np.flatnonzero(again)
    if not duplicates.size:
        return keys, empty, empty.astype(np.uint64)
    distinct = keys[~again]
    # The i-th duplicate (0-based) at position p repeats distinct value p - i - 1.
    owners = duplicates - np.arange(1, duplicates.size + 1)
    first = np.empty(owners.size, dtype=bool)
    first[0] = True
    np.not_equal(owners[1:], owners[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    counts = np.diff(starts, append=owners.size).astype(np.uint64) + np.uint64(1)
    return distinct, owners[starts], counts


def partition_bounds(num_partitions: int) -> list[tuple[int, int]]:
    """Equal key ranges [low, high) covering 0..2**64, one per partition (a power of two)."""
    if num_partitions < 1 or num_partitions & (num_partitions - 1):
        raise ValueError(f"num_partitions must be a power of two, got {num_partitions}")
    width = (1 << 64) // num_partitions
    return [(index * width, (index + 1) * width) for index in range(num_partitions)]
