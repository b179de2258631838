"""pybloomfiltermmap3's arithmetic, replicated in numpy: its keys (token ids as uint32le), its
k-seed MurmurHash3_x64_128 probe positions, its sizing, and its count and false-positive estimates.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import xxhash

from memfree.filterfile.hashing import fmix64_np

MAX_HASHES = 256  # hash_seeds[256] in the library's struct _BloomFilter
_C1, _C2 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)


def ngram_key_bytes(ngrams: np.ndarray) -> np.ndarray:
    """Library keys of n-grams: each token id as 4 little-endian bytes.

    Args:
        ngrams: integer array `(N, n)` of token ids in ``[0, 2**32)``.

    Returns:
        uint8 array `(N, 4 * n)`.
    """
    array = np.asarray(ngrams)
    if array.ndim != 2:
        raise ValueError(f"ngrams must be a 2-D (N, n) array, got shape {array.shape}")
    if array.size and (
        not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() >= 1 << 32
    ):
        raise ValueError("ngrams must hold integer token ids in [0, 2**32)")
    key_bytes = np.ascontiguousarray(array, dtype="<u4").view(np.uint8)
    return key_bytes.reshape(array.shape[0], 4 * array.shape[1])


def _rotl(values: np.ndarray, shift: int) -> np.ndarray:
    return (values << np.uint64(shift)) | (values >> np.uint64(64 - shift))


def murmur3_x64_128_xor(keys: np.ndarray, seed: int) -> np.ndarray:
    """MurmurHash3_x64_128 of each key, returned as ``h1 ^ h2`` (what the library probes with).

    Args:
        keys: uint8 array `(N, L)`, one key of L bytes per row (any L >= 0).
        seed: 32-bit seed.

    Returns:
        uint64 array `(N,)`.
    """
    keys = np.ascontiguousarray(keys, dtype=np.uint8)
    if keys.ndim != 2:
        raise ValueError(f"keys must be a 2-D (N, L) uint8 array, got shape {keys.shape}")
    num_keys, key_bytes = keys.shape
    num_blocks, tail_bytes = divmod(key_bytes, 16)
    if tail_bytes:  # zero bytes beyond the key leave the tail words as the C switch builds them
        keys = np.concatenate([keys, np.zeros((num_keys, 16 - tail_bytes), np.uint8)], axis=1)
    lanes = keys.view("<u8").astype(np.uint64) if keys.shape[1] else keys.astype(np.uint64)
    h1 = np.full(num_keys, seed & 0xFFFFFFFF, dtype=np.uint64)
    h2 = h1.copy()
    with np.errstate(over="ignore"):
        for block in range(num_blocks):
            h1 ^= _rotl(lanes[:, 2 * block] * _C1, 31) * _C2
            h1 = (_rotl(h1, 27) + h2) * np.uint64(5) + np.uint64(0x52DCE729)
            h2 ^= _rotl(lanes[:, 2 * block + 1] * _C2, 33) * _C1
            h2 = (_rotl(h2, 31) + h1) * np.uint64(5) + np.uint64(0x38495AB5)
        if tail_bytes > 8:
            h2 ^= _rotl(lanes[:, 2 * num_blocks + 1] * _C2, 33) * _C1
        if tail_bytes:
            h1 ^= _rotl(lanes[:, 2 * num_blocks] * _C1, 31) * _C2
        h1 ^= np.uint64(key_bytes)
        h2 ^= np.uint64(key_bytes)
        h1 += h2
        h2 += h1
        h1, h2 = fmix64_np(h1), fmix64_np(h2)
        h1 += h2
        h2 += h1
    result: np.ndarray = h1 ^ h2
    return result


def probe_positions(keys: np.ndarray, seeds: list[int], num_bits: int) -> np.ndarray:
    """Bit positions the library sets for each key; int64 `(N, len(seeds))`."""
    columns = [murmur3_x64_128_xor(keys, seed) % np.uint64(num_bits) for seed in seeds]
    return np.stack(columns, axis=1).astype(np.int64).reshape(len(keys), len(seeds))


def expected_false_positive_rate(num_ngrams: int, num_bits: int, num_hashes: int) -> float:
    """The standard Bloom filter estimate ``(1 - exp(-k N / m)) ** k``."""
    return float((1.0 - math.exp(-num_hashes * num_ngrams / num_bits)) ** num_hashes)


def estimate_num_ngrams(bits: np.ndarray, num_bits: int, num_hashes: int) -> int:
    """The library's ``approx_len``, ``-(m / k) ln(1 - X / m)`` for X bits set."""
    popcount = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).sum(axis=1)
    chunk = 1 << 24
    bits_set = sum(int(popcount[bits[i : i + chunk]].sum()) for i in range(0, len(bits), chunk))
    return round(-num_bits / num_hashes * math.log1p(-min(bits_set / num_bits, 1 - 1e-12)))


def library_size(capacity: int, error_rate: float) -> tuple[int, int]:
    """``(num_hashes, num_bits)`` of ``BloomFilter(capacity, error_rate)``, as the library's
    ``_create`` computes them: k rounded down, then whole bytes, at least 128 bits."""
    num_hashes = min(max(math.floor(math.log2(1 / error_rate)), 1), MAX_HASHES)
    bits_per_hash = math.ceil(
        capacity * abs(math.log(error_rate)) / (num_hashes * math.log(2) ** 2)
    )
    return num_hashes, max(math.ceil(num_hashes * bits_per_hash / 8.0) * 8, 128)


def derive_seeds(hash_seed: int, num_hashes: int) -> list[int]:
    """``num_hashes`` distinct 32-bit probe seeds derived from a 64-bit seed (the library draws
    random ones; deriving them makes the same inputs give the same file)."""
    seeds: list[int] = []
    for counter in itertools.count():
        seed = xxhash.xxh64_intdigest(counter.to_bytes(8, "little"), seed=hash_seed) & 0xFFFFFFFF
        if seed not in seeds:
            seeds.append(seed)
        if len(seeds) == num_hashes:
            break
    return seeds
