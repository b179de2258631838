"""Reading a prefix-keyed index: one lookup per row (the records' layout is in
:mod:`memfree.filterfile.index.layout`).

A row's prefix fingerprint picks its bucket through the directory; the bucket's records whose
remainder equals the prefix's are the next tokens (or next-word fields) stored after it. These
functions work on the arrays of an open file (:class:`IndexArrays`), for the reader
(:mod:`memfree.filterfile.index.reader`) and the guard core alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from memfree.filterfile.index.layout import IndexShape, top_bits

_U1 = np.uint64(1)
_U6 = np.uint64(6)
_U63 = np.uint64(63)


def read_fields(words: np.ndarray, first_bits: np.ndarray, width: int) -> np.ndarray:
    """The ``width``-bit fields starting at bit offsets ``first_bits`` (uint64) of ``words``,
    which must hold one word past the last field's (the file's records end with a zero word)."""
    index = (first_bits >> _U6).astype(np.int64)
    np.clip(index, 0, words.shape[0] - 2, out=index)  # a damaged directory never reads outside
    shifts = first_bits & _U63
    low = words[index] >> shifts
    high = (words[index + 1] << _U1) << (np.uint64(63) - shifts)
    return (low | high) & np.uint64((1 << width) - 1)


@dataclass(frozen=True)
class IndexArrays:
    """An index file's arrays and widths: what the guard core looks rows up in.

    Attributes:
        shape: the widths.
        directory: uint32 `(shape.directory_entries,)`, memory-mapped: never write.
        words: uint64 records of every section, then one zero word, memory-mapped.
        section_words: int64 `(num_sections,)` the first word of each section's records.
        hash_seed: the seed of the prefix fingerprints.
        max_bucket: most records in one bucket (the header's, checked when verified).
        ensure: called with the buckets a lookup is about to read; raises when one of them is
            damaged (verifies each block of buckets on its first read), or None (the file is not
            verified).
        ensure_all: checks every block (for a reader that copies the whole file), or None.
    """

    shape: IndexShape
    directory: np.ndarray
    words: np.ndarray
    section_words: np.ndarray
    hash_seed: int
    max_bucket: int
    ensure: Callable[[np.ndarray], None] | None = field(default=None, compare=False)
    ensure_all: Callable[[], None] | None = field(default=None, compare=False)


def bucket_ranges(
    index: IndexArrays, prefix_fingerprints: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each prefix's bucket: (first local record, end, section, remainder), all int64 but the
    uint64 remainders."""
    shape = index.shape
    fingerprints = np.asarray(prefix_fingerprints, dtype=np.uint64)
    buckets = top_bits(fingerprints, shape.bucket_bits).astype(np.int64)
    sections = buckets >> (shape.bucket_bits - shape.section_bits)
    if index.ensure is not None:
        index.ensure(buckets)
    entry = buckets + sections  # each section's directory has one entry more than buckets
    directory = index.directory
    np.clip(entry, 0, directory.shape[0] - 2, out=entry)
    first = directory[entry].astype(np.int64)
    end = np.maximum(directory[entry + 1].astype(np.int64), first)
    remainders = np.zeros(fingerprints.shape[0], dtype=np.uint64)
    if shape.remainder_bits:
        remainders = fingerprints >> np.uint64(64 - shape.bucket_bits - shape.remainder_bits)
        remainders &= np.uint64((1 << shape.remainder_bits) - 1)
    return first, end, sections, remainders


def lookup(index: IndexArrays, prefix_fingerprints: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stored next tokens of each prefix: (row of each, token id), int64 arrays.

    Every stored (prefix, token) is returned for its rows; a pair that is not stored is returned
    only through a prefix whose top ``b + R`` fingerprint bits match another's.
    """
    first, end, sections, remainders = bucket_ranges(index, prefix_fingerprints)
    lengths = end - first
    total = int(lengths.sum())
    if total == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    rows = np.repeat(np.arange(first.shape[0]), lengths)
    starts = np.cumsum(lengths) - lengths
    local = np.arange(total, dtype=np.int64) + np.repeat(first - starts, lengths)
    width = index.shape.record_bits
    bit_offsets = (index.section_words[sections[rows]] * 64).astype(np.uint64)
    bit_offsets += local.astype(np.uint64) * np.uint64(width)
    values = read_fields(index.words, bit_offsets, width)
    token_bits = np.uint64(index.shape.token_bits)
    keep = (values >> token_bits) == remainders[rows]
    tokens = (values[keep] & np.uint64((1 << index.shape.token_bits) - 1)).astype(np.int64)
    return rows[keep], tokens


def contains_keys(
    index: IndexArrays, prefix_fingerprints: np.ndarray, nexts: np.ndarray
) -> np.ndarray:
    """Whether each (prefix fingerprint, next value) pair is stored: bool `(N,)`, never a false
    negative. Only the low ``token_bits`` bits of each next value are compared (a word index
    keeps that many bits of the next word's hash).

    Each distinct prefix's bucket is read once: pairs that share a prefix (rows of one prompt,
    a prefix with thousands of stored next words) cost its records once, not once per pair."""
    token_bits = index.shape.token_bits
    nexts = np.asarray(nexts).astype(np.uint64) & np.uint64((1 << token_bits) - 1)
    prefixes = np.asarray(prefix_fingerprints, dtype=np.uint64).reshape(-1)
    distinct, which = np.unique(prefixes, return_inverse=True)
    if distinct.shape[0] >= 1 << (64 - token_bits):  # too many to key pairs in 64 bits
        rows, tokens = lookup(index, prefixes)
        found = np.zeros(nexts.shape[0], dtype=bool)
        found[rows[tokens.astype(np.uint64) == nexts[rows]]] = True
        return found
    rows, tokens = lookup(index, distinct)
    shift = np.uint64(token_bits)
    stored = (rows.astype(np.uint64) << shift) | tokens.astype(np.uint64)
    return np.isin((which.reshape(-1).astype(np.uint64) << shift) | nexts, stored)


__all__ = ["IndexArrays", "bucket_ranges", "contains_keys", "lookup", "read_fields"]
