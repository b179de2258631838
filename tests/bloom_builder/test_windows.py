"""The fingerprint-windows step: carry-over across cuts and special-token cuts, piece by piece
and batch by batch, against a naive reference."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bloom_builder.windows import batch_windows, fingerprint_windows
from memfree.filterfile.hashing import fingerprint_reference

SEED = 12345


def naive_windows(document: list[int], ngram_size: int, special: set[int]) -> list[tuple[int, ...]]:
    """Every window of the whole document that holds no special id, in order."""
    return [
        tuple(document[start : start + ngram_size])
        for start in range(len(document) - ngram_size + 1)
        if not special & set(document[start : start + ngram_size])
    ]


def windows_by_pieces(
    documents: list[list[int]], cuts: list[list[int]], ngram_size: int, special: set[int]
) -> tuple[list[tuple[int, ...]], list[int], list[int]]:
    """The windows, fingerprints and prefix fingerprints the step gives for documents cut into
    pieces at ``cuts`` (positions inside each document), pieces fed in order with their carry."""
    special_ids = np.array(sorted(special), dtype=np.uint32)
    found: list[tuple[int, ...]] = []
    fingerprints: list[int] = []
    prefixes: list[int] = []
    carry = None
    for document, positions in zip(documents, cuts, strict=True):
        bounds = [0, *sorted(positions), len(document)]
        for piece, (begin, end) in enumerate(itertools.pairwise(bounds)):
            windows = fingerprint_windows(
                np.array(document[begin:end], dtype=np.uint32),
                carry,
                piece < len(bounds) - 2,
                ngram_size,
                SEED,
                special_ids,
                prefixes=True,
            )
            carry = windows.carry
            found += [tuple(int(i) for i in row) for row in windows.ngrams(ngram_size)]
            fingerprints += [int(f) for f in windows.fingerprints]
            if windows.prefix_fingerprints is not None:
                prefixes += [int(f) for f in windows.prefix_fingerprints]
    return found, fingerprints, prefixes


def test_a_window_across_a_cut_is_kept_and_one_holding_a_special_id_is_not() -> None:
    special = np.array([0], dtype=np.uint32)
    first = fingerprint_windows(np.array([5, 6, 7], np.uint32), None, True, 3, SEED, special)
    second = fingerprint_windows(
        np.array([8, 0, 9], np.uint32), first.carry, False, 3, SEED, special
    )
    assert first.ngrams(3).tolist() == [[5, 6, 7]]
    assert first.carry.tolist() == [6, 7]
    assert second.ngrams(3).tolist() == [[6, 7, 8]]  # [7, 8, 0] and [8, 0, 9] hold the special
    assert second.carry.size == 0  # the document ends: nothing carries into the next one
    assert second.fingerprints.tolist() == [fingerprint_reference([6, 7, 8], SEED)]


def test_a_piece_shorter_than_the_carry_keeps_all_of_it() -> None:
    none = np.empty(0, dtype=np.uint32)
    first = fingerprint_windows(np.array([1], np.uint32), None, True, 4, SEED, none)
    second = fingerprint_windows(np.array([2], np.uint32), first.carry, True, 4, SEED, none)
    third = fingerprint_windows(np.array([3, 4], np.uint32), second.carry, False, 4, SEED, none)
    assert first.fingerprints.size == second.fingerprints.size == 0
    assert second.carry.tolist() == [1, 2]
    assert third.ngrams(4).tolist() == [[1, 2, 3, 4]]


@st.composite
def cut_documents(draw: st.DrawFn) -> tuple[list[list[int]], list[list[int]], int, set[int]]:
    ngram_size = draw(st.integers(1, 6))
    documents = draw(st.lists(st.lists(st.integers(0, 7), max_size=40), min_size=1, max_size=4))
    cuts = [draw(st.lists(st.integers(0, len(document)), max_size=5)) for document in documents]
    special = draw(st.sets(st.integers(0, 7), max_size=3))
    return documents, cuts, ngram_size, special


@settings(max_examples=300, deadline=None)
@given(cut_documents())
def test_pieces_give_the_windows_of_the_whole_documents_without_specials(
    case: tuple[list[list[int]], list[list[int]], int, set[int]],
) -> None:
    documents, cuts, ngram_size, special = case
    found, fingerprints, prefixes = windows_by_pieces(documents, cuts, ngram_size, special)
    expected = [w for document in documents for w in naive_windows(document, ngram_size, special)]
    assert found == expected
    assert fingerprints == [fingerprint_reference(list(w), SEED) for w in expected]
    if ngram_size > 1:
        assert prefixes == [fingerprint_reference(list(w[:-1]), SEED) for w in expected]


@settings(max_examples=300, deadline=None)
@given(cut_documents(), st.lists(st.integers(1, 6), min_size=1, max_size=8))
def test_batches_of_pieces_give_the_windows_of_the_whole_documents(
    case: tuple[list[list[int]], list[list[int]], int, set[int]], batch_sizes: list[int]
) -> None:
    """The map step hashes a batch of pieces at once: windows across a document's cuts are kept,
    windows across two documents are not, wherever the batches begin and end."""
    documents, cuts, ngram_size, special = case
    pieces = []
    for document, positions in zip(documents, cuts, strict=True):
        bounds = [0, *sorted(positions), len(document)]
        for index, (begin, end) in enumerate(itertools.pairwise(bounds)):
            pieces.append((np.array(document[begin:end], np.uint32), index < len(bounds) - 2))
    special_ids = np.array(sorted(special), dtype=np.uint32)
    found: list[tuple[int, ...]] = []
    fingerprints: list[int] = []
    prefixes: list[int] = []
    carry, start, sizes = None, 0, itertools.cycle(batch_sizes)
    while start < len(pieces):
        batch = pieces[start : start + next(sizes)]
        start += len(batch)
        windows = batch_windows(batch, carry, ngram_size, SEED, special_ids, prefixes=True)
        carry = windows.carry
        found += [tuple(int(i) for i in row) for row in windows.ngrams(ngram_size)]
        fingerprints += [int(f) for f in windows.fingerprints]
        if windows.prefix_fingerprints is not None:
            prefixes += [int(f) for f in windows.prefix_fingerprints]
    expected = [w for document in documents for w in naive_windows(document, ngram_size, special)]
    assert found == expected
    assert fingerprints == [fingerprint_reference(list(w), SEED) for w in expected]
    if ngram_size > 1:
        assert prefixes == [fingerprint_reference(list(w[:-1]), SEED) for w in expected]
