"""A filter's bit arrays checked against its header: their xxh3 checksums, their share of set bits
(from the header's key and probe counts), and the digest binding those checksums to the hashing
parameters that placed the bits."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import xxhash

from memfree.filterfile.hashing import BLOCK_BITS
from memfree.filterfile.header import GUARD_FIELDS

# Set bits may stray from their expectation by block-load variance; 10% and 8 standard
# deviations never trip on a real filter (tests check filters from 1 to millions of n-grams) and
# still catch a bit array emptied, or a probe or n-gram count changed, behind the checksum.
_FILL_TOLERANCE = 0.10
_FILL_SIGMAS = 8.0

# What decides where an n-gram's bits are: a header edit of any of these (with the header's
# checksum recomputed) would make the filter answer "absent" for stored n-grams.
_HASHING_FIELDS = ("hash_scheme", "hash_seed", "layout", "n", "num_probes", "num_bits", "unit")


def hashing_digest(metadata: dict[str, Any]) -> str:
    """xxh3-64 binding the bit arrays' checksums to the parameters that placed their bits.

    The header's own checksum is recomputed by anyone who edits it; this one also has to be, and
    an edit of the seed or the probe count that misses it is refused rather than silently
    finding nothing.
    """
    prefix = metadata.get("prefix") or {}
    bound = {
        "bits_xxh3": metadata.get("bits_xxh3"),
        "prefix": [prefix.get("bits_xxh3"), prefix.get("num_probes"), prefix.get("num_bits")],
        **{field: metadata.get(field) for field in (*_HASHING_FIELDS, *GUARD_FIELDS)},
    }
    return xxhash.xxh3_64_hexdigest(json.dumps(bound, sort_keys=True).encode("utf-8"))


def bits_problem(
    metadata: dict[str, Any], bit_words: np.ndarray, prefix_bit_words: np.ndarray | None
) -> str | None:
    """The first mismatch between a filter's bit arrays and its header, or None.

    Checked in order: the checksums, then the share of set bits, then the hashing binding (last,
    so that an emptied array or a changed probe count is named for what it is).

    Args:
        metadata: the file's validated header metadata.
        bit_words: uint64 `(num_bits / 64,)`, the n-gram bit array.
        prefix_bit_words: uint64 `(prefix num_bits / 64,)`, or None without a prefix section.

    Returns:
        A sentence naming the problem, or None when the bits agree with the header.
    """
    if bits_checksum(bit_words) != metadata["bits_xxh3"]:
        return "bit array checksum mismatch"
    prefix: dict[str, Any] = metadata.get("prefix") or {}
    if prefix_bit_words is not None and bits_checksum(prefix_bit_words) != prefix["bits_xxh3"]:
        return "prefix bit array checksum mismatch"
    problem = fill_problem(
        "the bit array",
        count_set_bits(bit_words),
        metadata["num_ngrams"],
        metadata["num_bits"],
        metadata["num_probes"],
    )
    if not problem and prefix_bit_words is not None:
        problem = fill_problem(
            "the prefix section",
            count_set_bits(prefix_bit_words),
            prefix["num_prefixes"],
            prefix["num_bits"],
            prefix["num_probes"],
        )
    return problem or binding_problem(metadata)


def binding_problem(metadata: dict[str, Any]) -> str | None:
    """Why a header's hashing parameters are not those its bits were written with, or None:
    ``hashing_xxh3`` is missing or does not match :func:`hashing_digest` of the header."""
    recorded = metadata.get("hashing_xxh3")
    if not isinstance(recorded, str):
        return "metadata has no 'hashing_xxh3'"
    if recorded != hashing_digest(metadata):
        return (
            "its hashing parameters (hash_seed, n, num_probes, scheme, unit) or the fields the "
            "guard relies on (tokenizer fingerprint, special tokens, normalizer) are not those "
            "the bit array was written with: the header was edited, or written by an earlier "
            "memfree (rebuild it with this version)"
        )
    return None


def bits_checksum(bit_words: np.ndarray) -> str:
    """The xxh3-64 hex digest of a bit array's bytes, as the header records it."""
    return xxhash.xxh3_64_hexdigest(bit_words.data.cast("B"))


def count_set_bits(bit_words: np.ndarray, chunk_words: int = 1 << 20) -> int:
    """Number of set bits in a uint64 array (in bounded-memory chunks)."""
    total = 0
    for begin in range(0, bit_words.shape[0], chunk_words):
        part = np.asarray(bit_words[begin : begin + chunk_words]).view(np.uint64)
        if hasattr(np, "bitwise_count"):
            total += int(np.bitwise_count(part).sum(dtype=np.int64))
        else:  # numpy < 2.0
            total += int(np.unpackbits(part.view(np.uint8)).sum(dtype=np.int64))
    return total


def fill_problem(name: str, set_bits: int, num_keys: int, num_bits: int, num_probes: int) -> str:
    """Why ``set_bits`` cannot come from ``num_keys`` keys of ``num_probes`` probes, or "".

    Each key sets at most ``num_probes`` bits, in a block of 512 chosen by its hash, so at most
    ``num_keys * num_probes`` bits are set, and in expectation
    ``num_bits * (1 - exp(-(num_keys / blocks) * (1 - (1 - 1/512) ** num_probes)))``.
    """
    upper = num_keys * num_probes
    if num_keys and not set_bits:
        return f"{name} has no bit set although it holds {num_keys:,} keys: it would block nothing"
    blocks = num_bits // BLOCK_BITS
    missing_per_key = 1.0 - (1.0 - 1.0 / BLOCK_BITS) ** num_probes
    expected = num_bits * -math.expm1(-(num_keys / blocks) * missing_per_key)
    slack = _FILL_TOLERANCE * expected + _FILL_SIGMAS * math.sqrt(expected) + 8
    if set_bits > upper:
        return (
            f"{name} has {set_bits:,} bits set, more than its {num_keys:,} keys x {num_probes} "
            "probes can set"
        )
    if set_bits < expected - slack:
        return (
            f"{name} has {set_bits:,} bits set where its {num_keys:,} keys x {num_probes} probes "
            f"set about {expected:,.0f}: bits are missing, so stored n-grams would go unblocked"
        )
    if set_bits > expected + slack:
        return (
            f"{name} has {set_bits:,} bits set where its {num_keys:,} keys x {num_probes} probes "
            f"set about {expected:,.0f}"
        )
    return ""


__all__ = [
    "binding_problem",
    "bits_checksum",
    "bits_problem",
    "count_set_bits",
    "fill_problem",
    "hashing_digest",
]
