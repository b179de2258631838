"""Fingerprints of every n-gram window of a sequence: the builder's and eval's hot path, with
the same bits as :func:`memfree.filterfile.hashing.fingerprints_np` on each window (tested against the
Python-integer reference).
"""

from __future__ import annotations

import functools

import numpy as np

from memfree.filterfile.hashing import (
    DEFAULT_HASH_SEED,
    HORNER_MULTIPLIER,
    MASK64,
    fmix64_inplace_np,
)

_ONE = np.uint64(1)


def sliding_fingerprints_np(
    token_ids: np.ndarray, ngram_size: int, seed: int = DEFAULT_HASH_SEED
) -> np.ndarray:
    """Fingerprints of every n-gram of one token sequence, in order.

    Equal to ``fingerprints_np(sliding_window_view(token_ids, ngram_size))`` but with about
    log2(n) vector passes (:func:`_sliding_states_np`) and no (T, n) temporary.

    Args:
        token_ids: 1-D integer array `(num_tokens,)`.
        ngram_size: n.
        seed: hash seed.

    Returns:
        uint64 array `(max(num_tokens - n + 1, 0),)`.
    """
    token_ids = np.asarray(token_ids)
    if token_ids.shape[0] - ngram_size + 1 <= 0:
        return np.empty(0, dtype=np.uint64)
    states = _sliding_states_np(token_ids.astype(np.uint64) + _ONE, ngram_size)
    return _seeded_fmix(states, seed, ngram_size)


def sliding_fingerprint_pair_np(
    token_ids: np.ndarray, ngram_size: int, seed: int = DEFAULT_HASH_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Fingerprints of every n-gram of a sequence and of each one's (n-1)-id prefix.

    One pass of the Horner doubling for the prefixes; each n-gram's state is its prefix's times
    the multiplier plus its last id, so the pair costs little more than the n-grams alone.

    Args:
        token_ids: 1-D integer array `(num_tokens,)`.
        ngram_size: n (at least 2).
        seed: hash seed.

    Returns:
        uint64 arrays `(num_windows,)` each, ``num_windows = max(num_tokens - n + 1, 0)``:
        the n-grams' fingerprints, and those of their first n-1 ids, window by window.
    """
    if ngram_size < 2:
        raise ValueError(f"an n-gram needs n >= 2 to have a prefix, got {ngram_size}")
    token_ids = np.asarray(token_ids)
    count = token_ids.shape[0] - ngram_size + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64)
    shifted = token_ids.astype(np.uint64) + _ONE
    prefix_states = _sliding_states_np(shifted[:-1], ngram_size - 1)
    states = prefix_states * np.uint64(HORNER_MULTIPLIER)
    states += shifted[ngram_size - 1 :]
    return _seeded_fmix(states, seed, ngram_size), _seeded_fmix(prefix_states, seed, ngram_size - 1)


def _seeded_fmix(states: np.ndarray, seed: int, length: int) -> np.ndarray:
    """Fingerprints from unseeded Horner states of ``length`` ids, in place in ``states``."""
    states += np.uint64((seed & MASK64) * int(_multiplier_power(length)) & MASK64)
    return fmix64_inplace_np(states)


@functools.lru_cache(maxsize=256)
def _multiplier_power(exponent: int) -> np.uint64:
    """HORNER_MULTIPLIER**exponent modulo 2**64."""
    return np.uint64(pow(HORNER_MULTIPLIER, exponent, 1 << 64))


def _sliding_states_np(shifted: np.ndarray, length: int) -> np.ndarray:
    """Unseeded Horner states of every ``length``-window of ``shifted`` (uint64, ids + 1).

    A window's state is ``sum(shifted[i + c] * M**(length - 1 - c))``. States of width 2w are
    those of width w combined pairwise (``S_2w[i] = S_w[i] * M**w + S_w[i + w]``), and any width
    is a sum of such powers of two: about log2(length) multiply-adds instead of ``length``,
    with the same bits (every step is exact modulo 2**64).
    """
    total = shifted.shape[0] - length + 1
    by_width = {1: shifted}
    width = 1
    while width * 2 <= length:
        previous = by_width[width]
        combined = previous[: previous.shape[0] - width] * _multiplier_power(width)
        combined += previous[width:]
        width *= 2
        by_width[width] = combined
    result: np.ndarray | None = None
    done = 0
    for piece in sorted(by_width, reverse=True):
        if not length - done >= piece:
            continue
        part = by_width[piece][done : done + total]
        if result is None:
            result = part.copy()
        else:
            result *= _multiplier_power(piece)
            result += part
        done += piece
    assert result is not None and done == length
    return result
