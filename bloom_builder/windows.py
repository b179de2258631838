"""The fingerprint-windows step: which n-grams of a document piece are stored, and their
fingerprints; one function for both output formats, so both always store the same n-grams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memfree.filterfile.sliding import sliding_fingerprint_pair_np, sliding_fingerprints_np


@dataclass(frozen=True)
class Windows:
    """The stored windows of one document piece (or of consecutive pieces, :func:`batch_windows`).

    Attributes:
        sequence: ids `(num_ids,)`: the ids carried over from the previous piece, then this
            piece's (then the next pieces').
        clean: bool `(num_windows,)`, which of ``sequence``'s n-gram windows are stored (they
            hold no special id and lie inside one document); None when all of them are.
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
    :func:`batch_windows` does the same for many pieces at once.

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
    return batch_windows([(ids, continues)], carry, ngram_size, seed, special_ids, prefixes)


def batch_windows(
    pieces: Sequence[tuple[np.ndarray, bool]],
    carry: np.ndarray | None,
    ngram_size: int,
    seed: int,
    special_ids: np.ndarray,
    prefixes: bool = False,
) -> Windows:
    """:func:`fingerprint_windows` over consecutive pieces at once (the same windows, in order).

    The pieces are laid end to end after ``carry`` and hashed in one pass; a window is dropped
    when it spans the end of a document (a piece that does not continue) or holds a special id.
    A piece that continues simply runs on into the next one, which is what the carry-over does
    across calls. Hashing a batch rather than a document saves numpy's per-call cost, which is
    most of the time for documents of a few hundred ids.

    Args:
        pieces: ``(ids, continues)`` per piece, in stream order: ids integer `(num_ids,)`.
        carry: the previous call's ``Windows.carry`` (None or empty when none).
        ngram_size: n.
        seed: hash seed.
        special_ids: ids `(num_special,)` that no stored window may hold.
        prefixes: also fingerprint each kept window's (n-1)-id prefix.

    Returns:
        The batch's :class:`Windows`; its ``carry`` is for the piece after the last one.
    """
    parts = [ids for ids, _ in pieces]
    if carry is not None and carry.size:
        parts.insert(0, carry)
    if not parts:
        empty = np.empty(0, dtype=np.uint64)
        return Windows(np.empty(0, np.uint32), None, empty, empty if prefixes else None, empty)
    sequence = parts[0] if len(parts) == 1 else np.concatenate(parts)
    prefix_fingerprints = None
    if prefixes and ngram_size > 1:
        fingerprints, prefix_fingerprints = sliding_fingerprint_pair_np(sequence, ngram_size, seed)
    else:
        fingerprints = sliding_fingerprints_np(sequence, ngram_size, seed)
    offset = sequence.size - sum(ids.size for ids, _ in pieces)  # the carry's length
    ends = np.cumsum([ids.size for ids, _ in pieces]) + offset
    document_ends = [
        int(end) for end, (_, goes_on) in zip(ends, pieces, strict=True) if not goes_on
    ]
    keep = _kept_windows(sequence, ngram_size, fingerprints.size, special_ids, document_ends)
    if keep is not None:
        fingerprints = fingerprints[keep]
        if prefix_fingerprints is not None:
            prefix_fingerprints = prefix_fingerprints[keep]
    # Only what follows the last document end carries over, at most its last n-1 ids.
    start = document_ends[-1] if document_ends else 0
    continues = bool(pieces) and pieces[-1][1]
    keep_ids = ngram_size - 1 if continues else 0
    next_carry = sequence[max(sequence.size - keep_ids, start) :] if keep_ids else sequence[:0]
    return Windows(sequence, keep, fingerprints, prefix_fingerprints, next_carry)


def _kept_windows(
    sequence: np.ndarray,
    ngram_size: int,
    num_windows: int,
    special_ids: np.ndarray,
    document_ends: list[int],
) -> np.ndarray | None:
    """bool `(num_windows,)`: which windows lie inside one document and hold no special id;
    None when every window does.

    Windows are dropped around the few positions that matter (each document end, each special
    id), so the cost follows those positions rather than the sequence's length.
    """
    if not num_windows:
        return None
    span = ngram_size - 1
    # A document ending at e (exclusive) is spanned by windows e-n+1 .. e-1 (none when it ends
    # the sequence); one holding a special id at p by windows p-n+1 .. p.
    inner_ends = [end for end in document_ends if end < sequence.size]
    ranges = [(np.asarray(inner_ends, dtype=np.int64) - span, span)]
    special = _special_positions(sequence, special_ids)
    if special.size:
        ranges.append((special - span, ngram_size))
    dropped = [
        (starts[:, None] + np.arange(width)).ravel() for starts, width in ranges if starts.size
    ]
    if not dropped:
        return None
    drop = np.concatenate(dropped)
    drop = drop[(drop >= 0) & (drop < num_windows)]
    if not drop.size:
        return None
    keep = np.ones(num_windows, dtype=bool)
    keep[drop] = False
    return keep


def _special_positions(sequence: np.ndarray, special_ids: np.ndarray) -> np.ndarray:
    """int64 positions of ``sequence`` that hold a special id, ascending."""
    if not special_ids.size or not sequence.size:
        return np.empty(0, dtype=np.int64)
    top = int(special_ids.max())
    # A lookup table (ids above every special map to its last, False entry): one gather per
    # id, where np.isin makes one pass per special id.
    table = np.zeros(top + 2, dtype=bool)
    table[special_ids] = True
    return np.flatnonzero(table[np.minimum(sequence, top + 1)]).astype(np.int64)
