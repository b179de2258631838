"""Exact counting across spilled runs against a Counter: any buffer size (one run or many), any
key range, any min-count, any memory bound (sub-ranges)."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bloom_builder.counting import RunWriter, _distinct_repeats, count_range

KEYS = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63, 2**64 - 1]))


@settings(max_examples=150, deadline=None)
@given(
    pool=st.lists(KEYS, min_size=1, max_size=40, unique=True),
    picks=st.lists(st.integers(0, 39), max_size=400),
    chunks=st.integers(1, 9),
    buffer_entries=st.integers(1, 500),
    min_count=st.integers(1, 6),
    max_entries=st.sampled_from([1, 7, 10**9]),
    bounds=st.tuples(st.integers(0, 2**64), st.integers(0, 2**64)),
)
def test_count_range_keeps_exactly_the_keys_seen_min_count_times(
    pool: list[int],
    picks: list[int],
    chunks: int,
    buffer_entries: int,
    min_count: int,
    max_entries: int,
    bounds: tuple[int, int],
) -> None:
    stream = np.array([pool[i % len(pool)] for i in picks], dtype=np.uint64)
    low, high = min(bounds), max(bounds)
    with tempfile.TemporaryDirectory() as directory:
        writer = RunWriter(Path(directory) / "runs", buffer_entries)
        for chunk in np.array_split(stream, chunks):
            writer.add(chunk.copy())
        runs = writer.close()
        found = list(count_range(runs, low, high, min_count, max_entries))
    counts = Counter(int(key) for key in stream.tolist() if low <= key < high)
    kept = np.concatenate([keys for keys, _ in found]).tolist()
    assert kept == sorted(key for key, count in counts.items() if count >= min_count)
    assert sum(counted.distinct for _, counted in found) == len(counts)
    assert sum(counted.kept for _, counted in found) == len(kept)


@settings(max_examples=200, deadline=None)
@given(st.lists(KEYS, max_size=300), st.integers(1, 4))
def test_distinct_repeats_is_numpy_unique_with_counts(values: list[int], repeat: int) -> None:
    keys = np.sort(np.array(values * repeat + values[: len(values) // 2], dtype=np.uint64))
    expected_keys, expected_counts = np.unique(keys, return_counts=True)
    distinct, repeated, counts = _distinct_repeats(keys)
    assert distinct.dtype == np.uint64
    assert distinct.tolist() == expected_keys.tolist()
    full = np.ones(distinct.size, dtype=np.int64)
    full[repeated] = counts
    assert full.tolist() == expected_counts.tolist()
    assert (counts > 1).all() and np.all(np.diff(repeated) > 0)
