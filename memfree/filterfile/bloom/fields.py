"""A filter header's metadata checked field by field: types, ranges, agreement between fields, and
the expected false-positive rate recomputed from the sizes it states (the layout is in
:mod:`memfree.filterfile.header`)."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from memfree.filterfile.hashing import BLOCK_BITS, HASH_SCHEME, MAX_PROBES
from memfree.filterfile.header import MAX_NGRAM_SIZE
from memfree.filterfile.sizing import expected_false_positive_rate

LAYOUT = "blocked-512"
MAX_BLOCKS = 1 << 32
_REQUIRED_INTS = ("n", "num_bits", "num_probes", "hash_seed", "num_ngrams")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bits_problem(name: str, num_bits: int) -> str | None:
    if num_bits == 0 or num_bits % BLOCK_BITS or num_bits // BLOCK_BITS >= MAX_BLOCKS:
        return f"{name} is {num_bits}, must be a positive multiple of {BLOCK_BITS} below 2**41"
    return None


def _rate_problem(
    name: str, stated: Any, num_keys: int, num_bits: int, num_probes: int
) -> str | None:
    """The stated expected false-positive rate must be a number equal to the formula's."""
    if not _is_number(stated) or not 0.0 <= stated <= 1.0:
        return f"{name} is {stated!r}, expected a number in [0, 1]"
    recomputed = expected_false_positive_rate(num_keys, num_bits // BLOCK_BITS, num_probes)
    if not math.isclose(stated, recomputed, rel_tol=1e-6, abs_tol=1e-12):
        return f"{name} is {stated!r}, but the header's sizes give {recomputed:.6g}"
    return None


def check_metadata(metadata: Any) -> str | None:
    """The first problem with a filter header's metadata, or None.

    Args:
        metadata: the decoded JSON metadata of a memfree filter file.

    Returns:
        A sentence naming the field and the problem, or None when the header is consistent.
    """
    if not isinstance(metadata, dict):
        return "metadata is not a JSON object"
    for key in _REQUIRED_INTS:
        value = metadata.get(key)
        if not _is_int(value) or value < 0:
            return f"metadata field {key!r} is {value!r}, expected a non-negative integer"
    if metadata.get("layout") != LAYOUT:
        return f"unknown layout {metadata.get('layout')!r}, expected {LAYOUT!r}"
    if metadata.get("hash_scheme") != HASH_SCHEME:
        return f"unknown hash scheme {metadata.get('hash_scheme')!r}, expected {HASH_SCHEME!r}"
    if not 1 <= metadata["n"] <= MAX_NGRAM_SIZE:
        return f"n is {metadata['n']}, must be in [1, {MAX_NGRAM_SIZE}]"
    unit = metadata.get("unit", "token")
    if unit not in ("token", "word"):
        return f"unit is {unit!r}, expected 'token' or 'word'"
    if unit == "word" and not isinstance(metadata.get("normalizer"), str):
        return "a word filter's metadata names no normalizer"
    if not 1 <= metadata["num_probes"] <= MAX_PROBES:
        return f"num_probes is {metadata['num_probes']}, must be in [1, {MAX_PROBES}]"
    num_bits = metadata["num_bits"]
    problem = _bits_problem("num_bits", num_bits)
    if problem:
        return problem
    blocks = metadata.get("num_blocks", num_bits // BLOCK_BITS)
    if not _is_int(blocks) or blocks * BLOCK_BITS != num_bits:
        return f"num_blocks is {blocks!r}, but num_bits {num_bits} makes {num_bits // BLOCK_BITS}"
    if metadata["hash_seed"] >= 1 << 64:
        return "hash_seed does not fit in 64 bits"
    if not isinstance(metadata.get("bits_xxh3"), str):
        return "metadata has no bit array checksum"
    if not isinstance(metadata.get("hashing_xxh3"), str):
        # Without it an edit of the seed, n or probe count (header checksum recomputed) would
        # open cleanly and find none of the stored n-grams; memfree has written it since the
        # hashing parameters were bound, so a file without it is refused, never trusted.
        return (
            "metadata has no 'hashing_xxh3' (the checksum binding the bit array to its hash_seed, "
            "n and num_probes): the file predates it or its header was edited"
        )
    problem = _rate_problem(
        "expected_false_positive_rate",
        metadata.get("expected_false_positive_rate"),
        metadata["num_ngrams"],
        num_bits,
        metadata["num_probes"],
    )
    if problem:
        return problem
    target = metadata.get("target_false_positive_rate")
    if target is not None and (not _is_number(target) or not 0.0 < target < 1.0):
        return f"target_false_positive_rate is {target!r}, expected a number in (0, 1)"
    min_count = metadata.get("min_count")
    if min_count is not None and (not _is_int(min_count) or min_count < 1):
        return f"min_count is {min_count!r}, expected an integer >= 1"
    for key in ("tokenizer", "tokenizer_fingerprint", "normalizer"):
        value = metadata.get(key)
        if value is not None and not isinstance(value, str):
            return f"metadata field {key!r} is {value!r}, expected a string"
    special = metadata.get("special_token_ids")
    if special is not None and (
        not isinstance(special, list) or not all(_is_int(i) and i >= 0 for i in special)
    ):
        return "metadata field 'special_token_ids' is not a list of token ids"
    return _prefix_problem(metadata.get("prefix"), metadata["n"])


def _prefix_problem(prefix: Any, ngram_size: int) -> str | None:
    if prefix is None:
        return None
    if not isinstance(prefix, dict):
        return "metadata field 'prefix' is not a JSON object"
    if ngram_size < 2:
        return "a filter of 1-grams cannot have a prefix section"
    for key in ("num_bits", "num_probes", "num_prefixes"):
        value = prefix.get(key)
        if not _is_int(value) or value < 0:
            return f"prefix field {key!r} is {value!r}, expected a non-negative integer"
    if not 1 <= prefix["num_probes"] <= MAX_PROBES:
        return f"prefix num_probes is {prefix['num_probes']}, must be in [1, {MAX_PROBES}]"
    problem = _bits_problem("prefix num_bits", prefix["num_bits"])
    if problem:
        return problem
    if not isinstance(prefix.get("bits_xxh3"), str):
        return "prefix section has no checksum"
    return _rate_problem(
        "prefix expected_false_positive_rate",
        prefix.get("expected_false_positive_rate"),
        prefix["num_prefixes"],
        prefix["num_bits"],
        prefix["num_probes"],
    )


__all__ = ["LAYOUT", "MAX_BLOCKS", "MAX_NGRAM_SIZE", "check_metadata"]
