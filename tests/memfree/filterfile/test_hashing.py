"""The hash scheme: pinned vectors, and numpy and torch twins identical to the Python reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from memfree.filterfile.bloom.writer import set_fingerprint_bits
from memfree.filterfile.hashing import (
    BLOCK_BITS,
    DEFAULT_HASH_SEED,
    HORNER_MULTIPLIER,
    MASK64,
    extend_fingerprints_np,
    extend_fingerprints_torch,
    fingerprint_reference,
    fingerprints_np,
    fingerprints_torch,
    fmix64_np,
    fmix64_reference,
    fmix64_torch,
    horner_state_reference,
    horner_states_torch,
    next_token_states_torch,
    prefix_states_torch,
    probe_positions_np,
    probe_positions_reference,
    query_bits_np,
    query_bits_torch,
)
from memfree.filterfile.sliding import sliding_fingerprint_pair_np, sliding_fingerprints_np

# Pinned: if any of these change, every filter ever written answers wrongly. Never update them to
# make a test pass; bump the hash scheme name instead.
PINNED = [
    ((1, 2, 3), 0, 0x00DCACF7B00E6144, [1666, 1651, 1865, 1564]),
    ((0,), DEFAULT_HASH_SEED, 0x3015373FAA7A2E7A, [95786, 95834, 96203, 95871]),
    ((49151,) * 10, DEFAULT_HASH_SEED, 0x51EF118EE6554DD0, [164230, 163990, 164182, 164127]),
    (
        (17, 4, 1000, 3, 99, 0, 5, 6, 7, 8),
        DEFAULT_HASH_SEED,
        0xF40543E612C240C5,
        [488039, 488351, 488078, 487966],
    ),
]

U64 = (1 << 64) - 1


def _to_unsigned(values: torch.Tensor) -> list[int]:
    return [int(v) & U64 for v in values.reshape(-1).tolist()]


def test_reference_is_the_documented_horner_polynomial() -> None:
    # Written out by hand for (1, 2, 3) with seed 0: ((((0*P + 2)*P + 3)*P + 4) mod 2**64.
    state = ((2 * HORNER_MULTIPLIER + 3) * HORNER_MULTIPLIER + 4) & U64
    assert fingerprint_reference((1, 2, 3), seed=0) == fmix64_reference(state)
    assert fmix64_reference(0) == 0


@pytest.mark.parametrize(("ngram", "seed", "fingerprint", "positions"), PINNED)
def test_pinned_vectors(
    ngram: tuple[int, ...], seed: int, fingerprint: int, positions: list[int]
) -> None:
    assert fingerprint_reference(ngram, seed) == fingerprint
    assert int(fingerprints_np(np.array([ngram]), seed)[0]) == fingerprint
    assert _to_unsigned(fingerprints_torch(torch.tensor([ngram]), seed)) == [fingerprint]
    assert probe_positions_reference(fingerprint, 1000, 4) == positions
    assert probe_positions_np(np.array([fingerprint], dtype=np.uint64), 1000, 4).tolist() == [
        positions
    ]


ngram_batches = st.integers(1, 12).flatmap(
    lambda n: arrays(
        np.int64, st.tuples(st.integers(1, 20), st.just(n)), elements=st.integers(0, 2**31 - 1)
    )
)


@settings(max_examples=60, deadline=None)
@given(ngrams=ngram_batches, seed=st.integers(0, U64))
def test_numpy_and_torch_twins_match_reference(ngrams: np.ndarray, seed: int) -> None:
    expected = [fingerprint_reference(tuple(row), seed) for row in ngrams.tolist()]
    assert fingerprints_np(ngrams, seed).tolist() == expected
    assert _to_unsigned(fingerprints_torch(torch.from_numpy(ngrams), seed)) == expected
    # The guard's path: prefix state once, then every candidate last token.
    prefixes = torch.from_numpy(ngrams[:, :-1])
    candidates = torch.from_numpy(np.unique(ngrams[:, -1]))
    table = extend_fingerprints_torch(prefix_states_torch(prefixes, seed), candidates)
    for row, ngram in enumerate(ngrams.tolist()):
        column = int((candidates == ngram[-1]).nonzero()[0, 0])
        assert int(table[row, column]) & U64 == expected[row]


@settings(max_examples=60, deadline=None)
@given(ngrams=ngram_batches, seed=st.integers(0, U64))
def test_the_guards_steps_match_reference(ngrams: np.ndarray, seed: int) -> None:
    """The pieces the guard cores call: Horner states of the prefix (for the prefix section),
    then every candidate, in torch (any device) and numpy (the CPU's sparse path)."""
    assert U64 == MASK64
    prefixes = ngrams[:, :-1]
    states = horner_states_torch(torch.from_numpy(prefixes), seed)
    expected_states = [horner_state_reference(tuple(row), seed) for row in prefixes.tolist()]
    assert _to_unsigned(states) == expected_states
    assert _to_unsigned(fmix64_torch(states)) == [
        fingerprint_reference(tuple(row), seed) for row in prefixes.tolist()
    ]
    assert fmix64_np(np.asarray(expected_states, dtype=np.uint64)).tolist() == [
        fmix64_reference(state) for state in expected_states
    ]
    ready = next_token_states_torch(states)
    assert torch.equal(ready, prefix_states_torch(torch.from_numpy(prefixes), seed))
    candidates = np.unique(ngrams[:, -1]).astype(np.uint64)
    table = extend_fingerprints_np(ready.numpy().view(np.uint64), candidates)
    assert table.dtype == np.uint64 and table.shape == (ngrams.shape[0], candidates.shape[0])
    torch_table = extend_fingerprints_torch(ready, torch.from_numpy(candidates.astype(np.int64)))
    assert _to_unsigned(torch_table) == table.reshape(-1).tolist()
    for row, ngram in enumerate(ngrams.tolist()):
        column = int(np.flatnonzero(candidates == ngram[-1])[0])
        assert int(table[row, column]) == fingerprint_reference(tuple(ngram), seed)


@settings(max_examples=40, deadline=None)
@given(
    tokens=arrays(np.int64, st.integers(0, 60), elements=st.integers(0, 70000)),
    ngram_size=st.integers(1, 40),
    seed=st.integers(0, U64),
)
def test_sliding_fingerprints_equal_windowed(
    tokens: np.ndarray, ngram_size: int, seed: int
) -> None:
    result = sliding_fingerprints_np(tokens, ngram_size, seed)
    windows = [tuple(tokens[i : i + ngram_size]) for i in range(len(tokens) - ngram_size + 1)]
    assert result.tolist() == [fingerprint_reference(w, seed) for w in windows]


@settings(max_examples=40, deadline=None)
@given(
    fingerprints=arrays(np.uint64, st.integers(1, 50), elements=st.integers(0, U64)),
    num_blocks=st.integers(1, 2**32 - 1),
    num_probes=st.integers(1, 16),
)
def test_probe_positions_match_reference(
    fingerprints: np.ndarray, num_blocks: int, num_probes: int
) -> None:
    positions = probe_positions_np(fingerprints, num_blocks, num_probes)
    for row, fingerprint in enumerate(fingerprints.tolist()):
        expected = probe_positions_reference(fingerprint, num_blocks, num_probes)
        assert positions[row].tolist() == expected
        block = expected[0] // BLOCK_BITS
        assert all(p // BLOCK_BITS == block for p in expected), "all probes stay in one block"
        assert 0 <= block < num_blocks


@settings(max_examples=30, deadline=None)
@given(
    words=arrays(np.uint64, st.integers(1, 6).map(lambda b: b * 8), elements=st.integers(0, U64)),
    fingerprints=arrays(np.uint64, st.integers(1, 64), elements=st.integers(0, U64)),
    num_probes=st.integers(1, 12),
)
def test_query_twins_agree(words: np.ndarray, fingerprints: np.ndarray, num_probes: int) -> None:
    from_numpy = query_bits_np(words, fingerprints, num_probes)
    from_torch = query_bits_torch(
        torch.from_numpy(words.view(np.int64)),
        torch.from_numpy(fingerprints.view(np.int64)),
        num_probes,
    )
    assert from_torch.tolist() == from_numpy.tolist()
    # And both equal the definition: every probed bit is set.
    num_blocks = words.shape[0] // 8
    for row, fingerprint in enumerate(fingerprints.tolist()):
        bits = [
            (int(words[p // 64]) >> (p % 64)) & 1
            for p in probe_positions_reference(fingerprint, num_blocks, num_probes)
        ]
        assert from_numpy[row] == all(bits)


@settings(max_examples=60, deadline=None)
@given(
    tokens=arrays(np.int64, st.integers(0, 60), elements=st.integers(0, 70000)),
    ngram_size=st.integers(2, 33),
    seed=st.integers(0, U64),
)
def test_sliding_pair_equals_windowed_ngrams_and_prefixes(
    tokens: np.ndarray, ngram_size: int, seed: int
) -> None:
    full, prefix = sliding_fingerprint_pair_np(tokens, ngram_size, seed)
    windows = [tuple(tokens[i : i + ngram_size]) for i in range(len(tokens) - ngram_size + 1)]
    assert full.tolist() == [fingerprint_reference(w, seed) for w in windows]
    assert prefix.tolist() == [fingerprint_reference(w[:-1], seed) for w in windows]


@settings(max_examples=80, deadline=None)
@given(
    fingerprints=arrays(np.uint64, st.integers(0, 300), elements=st.integers(0, U64)),
    num_blocks=st.one_of(st.integers(1, 8), st.integers(1, 1 << 20)),
    num_probes=st.integers(1, 12),
    chunk=st.integers(1, 400),
    presorted=st.booleans(),
)
def test_set_fingerprint_bits_sets_exactly_the_reference_probes(
    fingerprints: np.ndarray, num_blocks: int, num_probes: int, chunk: int, presorted: bool
) -> None:
    """Both ways of setting bits (packed scratch for nearby blocks, scattered OR otherwise) set
    exactly the probes of the reference, sorted input or not, whatever the chunk size."""
    if presorted:
        fingerprints = np.sort(fingerprints)
    words = np.zeros(num_blocks * 8, dtype=np.uint64)
    set_fingerprint_bits(words, fingerprints, num_probes, chunk=chunk)
    expected = {
        position
        for value in fingerprints.tolist()
        for position in probe_positions_reference(value, num_blocks, num_probes)
    }
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    assert set(np.flatnonzero(bits).tolist()) == expected
