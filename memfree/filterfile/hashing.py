"""N-gram hashing shared bit for bit by the builder (numpy) and the guard (torch, CPU or CUDA).

A key is an n-gram of token ids. Its 64-bit fingerprint is a Horner polynomial over
``token_id + 1`` modulo 2**64, seeded, followed by the murmur3 ``fmix64`` finalizer. The guard
hashes the (n-1)-token prefix of a row once and derives every vocabulary candidate from it with
one multiply-add and the finalizer, so no division sits on the hot path.

Bloom probes use a cache-line-blocked layout (Putze, Sanders and Singler, "Cache-, Hash- and
Space-Efficient Bloom Filters"): the high 32 bits pick a 512-bit block by multiply-shift, and
probe i takes the top 9 bits of ``fingerprint * PROBE_MULTIPLIERS[i]``. (Double hashing inside
a 512-bit block was measured at 2.2x its formula's false-positive rate at 1e-3: its probe
patterns are too few and too correlated. Independent multipliers measure within a few percent.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

HASH_SCHEME = "horner-fmix64-blocked512-mulshift-v1"
DEFAULT_HASH_SEED = 0x6D656D66726565  # "memfree"
HORNER_MULTIPLIER = 0x9E3779B97F4A7C15  # odd, so each Horner step is a bijection mod 2**64
_FMIX_C1 = 0xFF51AFD7ED558CCD
_FMIX_C2 = 0xC4CEB9FE1A85EC53
BLOCK_BITS = 512
WORDS_PER_BLOCK = BLOCK_BITS // 64
MAX_PROBES = 32
MASK64 = (1 << 64) - 1  # Python-int arithmetic modulo 2**64 (the one copy; words.py imports it)
_PROBE_SHIFT = 64 - 9  # top 9 bits: a bit offset in [0, 512)


def _splitmix64(count: int, state: int) -> list[int]:
    values = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        value = state
        value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK64
        values.append((value ^ (value >> 31)) | 1)
    return values


# Fixed forever by the hash scheme (tests pin them through the known vectors).
PROBE_MULTIPLIERS: tuple[int, ...] = tuple(_splitmix64(MAX_PROBES, DEFAULT_HASH_SEED))


def _signed(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned ``value``."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


# ---------------------------------------------------------------------------------------------
# Python integers: the reference the twins are tested against, and the pinned vectors.


def horner_state_reference(
    ngram: list[int] | tuple[int, ...], seed: int = DEFAULT_HASH_SEED
) -> int:
    """The Horner state of ``ngram`` (before the finalizer) with plain Python integers.

    The word guard extends such states by one word with ``state * HORNER_MULTIPLIER + h + 1``.
    """
    state = seed & MASK64
    for token in ngram:
        state = (state * HORNER_MULTIPLIER + int(token) + 1) & MASK64
    return state


def fingerprint_reference(ngram: list[int] | tuple[int, ...], seed: int = DEFAULT_HASH_SEED) -> int:
    """Fingerprint of one n-gram with plain Python integers (slow, obviously correct)."""
    return fmix64_reference(horner_state_reference(ngram, seed))


def fmix64_reference(value: int) -> int:
    """murmur3's 64-bit finalizer on a Python integer."""
    value &= MASK64
    value ^= value >> 33
    value = (value * _FMIX_C1) & MASK64
    value ^= value >> 33
    value = (value * _FMIX_C2) & MASK64
    value ^= value >> 33
    return value


def probe_positions_reference(fingerprint: int, num_blocks: int, num_probes: int) -> list[int]:
    """Absolute bit positions of one fingerprint's probes (Python integers)."""
    block = ((fingerprint >> 32) * num_blocks) >> 32
    return [
        block * BLOCK_BITS + (((fingerprint * PROBE_MULTIPLIERS[i]) & MASK64) >> _PROBE_SHIFT)
        for i in range(num_probes)
    ]


# ---------------------------------------------------------------------------------------------
# numpy twin (builder, NgramFilter.contains). uint64 arithmetic wraps modulo 2**64.


_U1, _U6, _U32, _U33, _U63 = (np.uint64(v) for v in (1, 6, 32, 33, 63))
_FMIX1, _FMIX2 = np.uint64(_FMIX_C1), np.uint64(_FMIX_C2)


def fmix64_np(values: np.ndarray) -> np.ndarray:
    """The murmur3 finalizer of each uint64 value (a new array; the input is left as it is)."""
    with np.errstate(over="ignore"):
        values = values ^ (values >> _U33)
        values *= _FMIX1
        values ^= values >> _U33
        values *= _FMIX2
        values ^= values >> _U33
    return values


def fmix64_inplace_np(values: np.ndarray) -> np.ndarray:
    """:func:`fmix64_np` in place on a uint64 array (returned), with one scratch array.

    Arrays only: numpy wraps array integer arithmetic silently, so no ``np.errstate`` (whose
    cost is most of a call on short documents) is needed.
    """
    scratch = values >> _U33
    values ^= scratch
    values *= _FMIX1
    np.right_shift(values, _U33, out=scratch)
    values ^= scratch
    values *= _FMIX2
    np.right_shift(values, _U33, out=scratch)
    values ^= scratch
    return values


def sparse_members_np(
    bit_words: np.ndarray, fingerprints: np.ndarray, num_probes: int
) -> np.ndarray:
    """Indices of the fingerprints whose probes are all set in a blocked bit array.

    The same answer as :func:`query_bits_np`, faster for many candidates: a candidate drops at
    its first unset probe (about half drop per probe), so later probes look at fewer.
    """
    fingerprints = np.asarray(fingerprints, dtype=np.uint64)
    bit_words = bit_words.view(np.ndarray)  # a memmap's __getitem__ costs more than the lookup
    index = np.arange(fingerprints.shape[0])
    if not index.size:
        return index
    shift = np.uint64(_PROBE_SHIFT)
    with np.errstate(over="ignore"):
        num_blocks = np.uint64(bit_words.shape[0] // WORDS_PER_BLOCK)
        base = (((fingerprints >> _U32) * num_blocks) >> _U32) * np.uint64(WORDS_PER_BLOCK)
        for probe in range(num_probes):
            offset = (fingerprints * np.uint64(PROBE_MULTIPLIERS[probe])) >> shift
            # int64 indices: numpy casts uint64 ones element by element (about 3x slower).
            index_words = (base + (offset >> _U6)).view(np.int64)
            keep = np.flatnonzero((bit_words[index_words] >> (offset & _U63)) & _U1)
            fingerprints, base, index = fingerprints[keep], base[keep], index[keep]
            if not keep.size:
                break
    return index


def extend_fingerprints_np(prefix_states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Fingerprints of (prefix, token) for every row and candidate: the numpy twin of
    :func:`extend_fingerprints_torch`, used by the guard's CPU path.

    Args:
        prefix_states: uint64 `(batch,)` Horner states already multiplied for the last token
            (:func:`prefix_states_torch`'s bits).
        tokens: uint64 `(num_candidates,)` token ids (or word hashes).

    Returns:
        uint64 `(batch, num_candidates)` fingerprints.
    """
    with np.errstate(over="ignore"):
        # + 1 on the (batch,) states rather than on every candidate: the same bits mod 2**64.
        return fmix64_np((prefix_states + _U1)[:, None] + tokens[None, :])


def fingerprints_np(ngrams: np.ndarray, seed: int = DEFAULT_HASH_SEED) -> np.ndarray:
    """Fingerprints of a batch of n-grams.

    Args:
        ngrams: integer array `(num_ngrams, n)` of non-negative token ids.
        seed: the hash seed recorded in the filter header.

    Returns:
        uint64 array `(num_ngrams,)`.
    """
    ngrams = np.asarray(ngrams)
    if ngrams.ndim != 2:
        raise ValueError(f"ngrams must be a 2-D (num_ngrams, n) array, got shape {ngrams.shape}")
    ngram_size = ngrams.shape[1]
    with np.errstate(over="ignore"):
        state = np.full(ngrams.shape[0], np.uint64(seed & MASK64), dtype=np.uint64)
        multiplier = np.uint64(HORNER_MULTIPLIER)
        for column in range(ngram_size):
            state = state * multiplier + (ngrams[:, column].astype(np.uint64) + np.uint64(1))
        return fmix64_np(state)


def probe_positions_np(fingerprints: np.ndarray, num_blocks: int, num_probes: int) -> np.ndarray:
    """Absolute bit positions probed for each fingerprint.

    Args:
        fingerprints: uint64 array `(N,)`.
        num_blocks: number of 512-bit blocks in the filter (< 2**32).
        num_probes: bits set per key.

    Returns:
        int64 array `(N, num_probes)` of bit positions in ``[0, num_blocks * 512)``.
    """
    fingerprints = np.asarray(fingerprints, dtype=np.uint64)
    with np.errstate(over="ignore"):
        block = ((fingerprints >> np.uint64(32)) * np.uint64(num_blocks)) >> np.uint64(32)
    return block.astype(np.int64)[:, None] * BLOCK_BITS + probe_offsets_np(fingerprints, num_probes)


def probe_offsets_np(fingerprints: np.ndarray, num_probes: int) -> np.ndarray:
    """Each fingerprint's probe offsets inside its block: int64 `(N, num_probes)` in [0, 512)."""
    fingerprints = np.asarray(fingerprints, dtype=np.uint64)
    offsets = np.empty((num_probes, fingerprints.shape[0]), dtype=np.int64)
    shift = np.uint64(_PROBE_SHIFT)
    with np.errstate(over="ignore"):
        for probe in range(num_probes):
            row = fingerprints * np.uint64(PROBE_MULTIPLIERS[probe])
            row >>= shift
            offsets[probe] = row
    return offsets.T  # a view: one contiguous row per probe was cheaper to fill


def query_bits_np(bit_words: np.ndarray, fingerprints: np.ndarray, num_probes: int) -> np.ndarray:
    """Membership of each fingerprint in a blocked bit array of little-endian uint64 words."""
    num_blocks = bit_words.shape[0] // WORDS_PER_BLOCK
    positions = probe_positions_np(fingerprints, num_blocks, num_probes)
    found = (bit_words[positions >> 6] >> (positions & 63).astype(np.uint64)) & np.uint64(1)
    result: np.ndarray = found.astype(bool).all(axis=1)
    return result


# ---------------------------------------------------------------------------------------------
# torch twin (guard). torch has no uint64 arithmetic, so int64 with wrapping multiply/add and
# logical right shifts emulated with a mask; the bits are the same as the numpy twin's.


def _lshr(values: torch.Tensor, shift: int) -> torch.Tensor:
    return (values >> shift) & ((1 << (64 - shift)) - 1)


def fmix64_torch(values: torch.Tensor) -> torch.Tensor:
    """The murmur3 finalizer of each int64 value (bits as the uint64 numpy twin's)."""
    values = values ^ _lshr(values, 33)
    values = values * _signed(_FMIX_C1)
    values = values ^ _lshr(values, 33)
    values = values * _signed(_FMIX_C2)
    return values ^ _lshr(values, 33)


def horner_states_torch(prefixes: torch.Tensor, seed: int = DEFAULT_HASH_SEED) -> torch.Tensor:
    """Horner state of each row's prefix, before the finalizer.

    ``fmix64_torch`` of it is the prefix's own fingerprint (what the prefix section stores);
    times ``HORNER_MULTIPLIER`` it is :func:`prefix_states_torch`.

    Args:
        prefixes: int64 tensor `(batch, n - 1)`.
        seed: hash seed.

    Returns:
        int64 tensor `(batch,)`.
    """
    multiplier = _signed(HORNER_MULTIPLIER)
    state = prefixes.new_full((prefixes.shape[0],), _signed(seed))
    for column in range(prefixes.shape[1]):
        state = state * multiplier + (prefixes[:, column].long() + 1)
    return state


def prefix_states_torch(prefixes: torch.Tensor, seed: int = DEFAULT_HASH_SEED) -> torch.Tensor:
    """Horner state of each row's (n-1)-token prefix, multiplied once more for the last token.

    Args:
        prefixes: int64 tensor `(batch, n - 1)`.
        seed: hash seed.

    Returns:
        int64 tensor `(batch,)`: ``state * HORNER_MULTIPLIER``; adding ``token + 1`` and applying
        the finalizer gives the fingerprint of (prefix, token).
    """
    return next_token_states_torch(horner_states_torch(prefixes, seed))


def next_token_states_torch(states: torch.Tensor) -> torch.Tensor:
    """Horner states (any shape, int64) made ready for one more token: ``state * multiplier``,
    the input of :func:`extend_fingerprints_torch`."""
    return states * _signed(HORNER_MULTIPLIER)


def extend_fingerprints_torch(prefix_states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Fingerprints of (prefix, token) for every row and every candidate token.

    Args:
        prefix_states: int64 `(batch,)` from :func:`prefix_states_torch`.
        tokens: int64 `(num_candidates,)` token ids.

    Returns:
        int64 `(batch, num_candidates)` fingerprints (same bits as the uint64 numpy twin).
    """
    return fmix64_torch(prefix_states[:, None] + (tokens[None, :] + 1))


def fingerprints_torch(ngrams: torch.Tensor, seed: int = DEFAULT_HASH_SEED) -> torch.Tensor:
    """Fingerprints of a `(N, n)` int64 tensor of n-grams; int64 `(N,)`."""
    states = prefix_states_torch(ngrams[:, :-1], seed)
    return fmix64_torch(states + ngrams[:, -1].long() + 1)


def query_bits_torch(
    bit_words: torch.Tensor, fingerprints: torch.Tensor, num_probes: int
) -> torch.Tensor:
    """Membership of fingerprints (any shape, int64) in blocked int64 bit_words; bool, same shape."""
    num_blocks = bit_words.shape[0] // WORDS_PER_BLOCK
    block = _lshr(_lshr(fingerprints, 32) * num_blocks, 32)
    base_word = block * WORDS_PER_BLOCK
    found = None
    for probe in range(num_probes):
        offset = _lshr(fingerprints * _signed(PROBE_MULTIPLIERS[probe]), _PROBE_SHIFT)
        bit = (bit_words[base_word + (offset >> 6)] >> (offset & 63)) & 1
        found = bit if found is None else found & bit
    assert found is not None  # num_probes >= 1 is validated when the filter opens
    return found.bool()
