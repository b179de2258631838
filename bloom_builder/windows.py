"""The fingerprint-windows step: which n-grams of a document piece are stored, and their
fingerprints; one function for both output formats, so both always store the same n-grams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memfree.hashing import sliding_fingerprints_np


@dataclass(frozen=True)
class Windows:
    """The stored windows of one document piece.

    Attributes:
        sequence: ids `(num_ids,)`: the ids carried over from the previous piece, then this
            piece's.
        clean: bool `(num_windows,)`, which of ``sequence``'s n-gram windows hold no special id;
            None when all of them are clean.
        fingerprints: uint64 `(num_kept,)` fingerprints of the clean windows, in order.
        prefix_fingerprints: uint64 `(num_kept,)` fingerprints of each clean window's first n-1
            ids, or None when not asked for (or n is 1).
        carry: the ids the next piece starts with: the last n-1 of ``sequence`` if this piece
            continues, else none.
    """

    sequence: np.ndarray
    clean: np.ndarray | None
    fingerprints: np.ndarray
    prefix_fingerprints: np.ndarray | None
    carry: np.ndarray

    def ngrams(self, ngram_size: int) -> np.ndarray:
        """The clean windows themselves, ids `(num_kept, ngram_size)` in order."""
        if self.fingerprints.size == 0:
            return np.empty((0, ngram_size), dtype=self.sequence.dtype)
        windows = np.lib.stride_tricks.sliding_window_view(self.sequence, ngram_size)
        return windows if self.clean is None else windows[self.clean]


def fingerprint_windows(
    ids: np.ndarray,
    carry: np.ndarray | None,
    continues: bool,
    ngram_size: int,
    seed: int,
    special_ids: np.ndarray,
    prefixes: bool = False,
) -> Windows:
    """The n-gram windows of one document piece to store, with their fingerprints.

    Two rules. A document cut into pieces (a long text file read in segments, or a segment cut
    to bound tokenization memory) is one sequence: the last n-1 ids of a piece carry over to the
    next, so the n-grams across every cut are stored exactly as if the document were encoded
    whole. A window that holds a special id (end of sequence, chat markers, ...) is never
    stored: the guard never blocks a special token, so no stored n-gram may contain one.

    Call it on a document's pieces in order, passing each call's ``Windows.carry`` to the next;
    a document that is not cut is one piece with ``carry=None`` and ``continues=False``.

    Args:
        ids: integer ids `(num_ids,)` of this piece (token ids, or word hashes).
        carry: the previous piece's ``Windows.carry`` (None or empty for a new document).
        continues: whether the next piece goes on with this document.
        ngram_size: n.
        seed: hash seed.
        special_ids: ids `(num_special,)` that no stored window may hold.
        prefixes: also fingerprint each kept window's (n-1)-id prefix (for the prefix section).

    Returns:
        The piece's :class:`Windows`.

    Example:
        >>> special = np.array([0], dtype=np.uint32)
        >>> first = fingerprint_windows(np.array([5, 6, 7], np.uint32), None, True, 2, 1, special)
        >>> second = fingerprint_windows(np.array([8, 0, 9], np.uint32), first.carry, False, 2, 1,
        ...                              special)
        >>> first.fingerprints.size, second.ngrams(2).tolist()
        (2, [[7, 8]])
    """
    sequence = np.concatenate((carry, ids)) if carry is not None and carry.size else ids
    fingerprints = sliding_fingerprints_np(sequence, ngram_size, seed)
    prefix_fingerprints = None
    if prefixes and ngram_size > 1:
        prefix_fingerprints = sliding_fingerprints_np(sequence[:-1], ngram_size - 1, seed)
    clean = _clean_windows(sequence, ngram_size, fingerprints.size, special_ids)
    if clean is not None:
        fingerprints = fingerprints[clean]
        if prefix_fingerprints is not None:
            prefix_fingerprints = prefix_fingerprints[clean]
    keep = ngram_size - 1 if continues else 0
    # max(): a piece shorter than n-1 ids carries all of them (a negative start would wrap).
    next_carry = sequence[max(sequence.size - keep, 0) :] if keep else sequence[:0]
    return Windows(sequence, clean, fingerprints, prefix_fingerprints, next_carry)


def _clean_windows(
    sequence: np.ndarray, ngram_size: int, num_windows: int, special_ids: np.ndarray
) -> np.ndarray | None:
    """bool `(num_windows,)`: which windows hold no special id; None when every one is clean."""
    if not num_windows or not special_ids.size:
        return None
    special = np.isin(sequence, special_ids)
    if not special.any():
        return None
    # Specials seen before each position: a window holds none when the count does not change
    # across it (one pass, whatever n is).
    before = np.concatenate(([0], np.cumsum(special)))
    return np.asarray(before[ngram_size:] == before[:num_windows])
