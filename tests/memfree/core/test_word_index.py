"""The word index (the prefix-keyed layout over word n-grams) and the word guard's fast path over
it: exact against a reference set, chance matches explained, and the path's answers those of the
file's own ``contains``, lookup for lookup."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memfree.core.word_fast import Lookup
from memfree.core.word_index import WordIndex
from memfree.filterfile import open_filter
from memfree.filterfile.hashing import fingerprints_np, fmix64_np, horner_state_reference
from memfree.filterfile.index.reader import IndexFilter
from memfree.filterfile.index.sizing import word_rate, word_shape, word_token_bits
from memfree.vocab.words import word_metadata


def _explained(filt: IndexFilter, row: np.ndarray, stored: set[tuple[int, ...]]) -> bool:
    """Whether a reported n-gram is stored, or shares its key's kept bits with a stored one: the
    prefix's top b + R fingerprint bits and the next word's low t bits."""
    if tuple(row.tolist()) in stored:
        return True
    shape = filt.prefix_index().shape
    top = shape.bucket_bits + shape.remainder_bits
    low = np.uint64((1 << shape.token_bits) - 1)
    rows = np.array(sorted(stored), dtype=np.uint64).reshape(len(stored), -1)
    seed = filt.hash_seed
    mine = fingerprints_np(row[None, :-1], seed)[0]
    theirs = fingerprints_np(rows[:, :-1], seed)
    same_prefix = (theirs >> np.uint64(64 - top)) == (mine >> np.uint64(64 - top)) if top else True
    same_word = (rows[:, -1] & low) == (row[-1] & low)
    return bool(np.any(same_prefix & same_word))


@st.composite
def word_sets(draw: st.DrawFn) -> tuple[int, np.ndarray, float, int]:
    n = draw(st.integers(1, 4))
    words = draw(st.integers(1, 40))  # a small vocabulary of words: prefixes repeat
    count = draw(st.integers(0, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    alphabet = rng.integers(0, 2**64, size=words, dtype=np.uint64)
    rows = alphabet[rng.integers(0, words, size=(count, n))]
    if count and draw(st.booleans()):  # one prefix with thousands of next words
        many = rng.integers(0, 2**64, size=(3000, n), dtype=np.uint64)
        many[:, :-1] = rows[0, :-1]
        rows = np.concatenate([rows, many])
    rate = draw(st.sampled_from([1e-2, 1e-5, 1e-9]))
    return n, rows, rate, int(draw(st.integers(0, 2**64 - 1)))


@settings(max_examples=30, deadline=None)
@given(word_sets(), st.data())
def test_the_word_index_is_exact_up_to_counted_collisions(
    case: tuple[int, np.ndarray, float, int], data: st.DataObject
) -> None:
    n, rows, rate, seed = case
    with tempfile.TemporaryDirectory() as directory:
        filt = IndexFilter.from_word_ngrams(
            Path(directory) / "w.memfree",
            rows,
            false_positive_rate=rate,
            hash_seed=seed,
            metadata=word_metadata(),
        )
        again = open_filter(Path(directory) / "w.memfree")
        assert again.unit == "word" and again.layout == "prefix-index-v1"
        stored = {tuple(row) for row in rows.tolist()}
        assert filt.contains(rows).all() if rows.size else len(filt) == 0
        # Others: words seen and unseen, prefixes seen and unseen.
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
        pool = np.concatenate([rows.reshape(-1), rng.integers(0, 2**64, 50, dtype=np.uint64)])
        others = pool[rng.integers(0, pool.shape[0], size=(200, n))]
        if rows.size:  # stored prefixes, other words
            others[:100, :-1] = rows[rng.integers(0, rows.shape[0], 100), :-1]
        found = filt.contains(others)
        for row, hit in zip(others, found, strict=True):
            assert hit == (tuple(row.tolist()) in stored) or (hit and _explained(filt, row, stored))
        # The guard's fast path answers as the file does, for groups and single lookups.
        side = WordIndex.of(n, filt.prefix_index())
        states = [horner_state_reference(row[:-1].tolist(), seed) for row in others]
        bases = np.array(states, dtype=np.uint64)
        assert np.array_equal(fmix64_np(bases), fingerprints_np(others[:, :-1], seed))
        lookups = [Lookup(bases[:80], others[:80, -1], gated=True)]
        lookups += [Lookup(bases[i : i + 1], others[i : i + 1, -1]) for i in range(80, 200, 40)]
        shared = Lookup(bases[:1], others[:, -1])  # one prefix, every candidate word
        answer = side.answer([*lookups, shared])
        after_first = np.column_stack([np.repeat(others[:1, :-1], 200, 0), others[:, -1]])
        expected = np.concatenate(
            [found[:80], found[80:81], found[120:121], found[160:161], filt.contains(after_first)]
        )
        assert np.array_equal(answer, expected)
        stored_prefix = side.prefix_found(fingerprints_np(rows[:, :-1], seed))
        assert stored_prefix.all()
        filt.close()


def test_the_word_index_widths_follow_the_rate() -> None:
    assert word_token_bits(1e-5) == 18 and word_token_bits(1e-9) == 31
    assert word_token_bits(0.5) == 8 and word_token_bits(1e-30) == 40
    for records in (10, 10_000, 4_000_000):
        for rate in (1e-3, 1e-5, 1e-7):
            for concentration in (2.0**-16, 1e-2, 0.5):  # uniform words to a few common ones
                shape = word_shape(records, rate, concentration)
                # met, or out of a 64-bit key's reach (the builder refuses it with the rate
                # that is reachable)
                full = shape.bucket_bits + shape.remainder_bits + shape.token_bits == 64
                assert word_rate(records, shape, concentration) <= rate or full
