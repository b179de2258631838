"""The prefix-index file's header: its byte layout, its metadata checked field by field, and the
checks of its sections against it (the layout's records are in
:mod:`memfree.filterfile.index_layout`).

Layout (all integers little-endian)::

    offset 0   the preamble of every native file (magic, format version 2, metadata length and
               its xxh3-64), then the UTF-8 JSON metadata, zero padding to a multiple of 4096
    then       uint32 directory: for each section, 2**(b-p) + 1 record offsets; padded to a page
    then       uint64 words: each section's packed records from a word boundary, section after
               section, then one zero word

The metadata records each section's record count and the xxh3-64 of its directory slice and
words, and ``hashing_xxh3`` binds those to the widths, seed and n that placed the records, as in
the Bloom layout: an edited header with its checksum recomputed is refused, never read as a
filter that finds less.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np
import xxhash

from memfree.filterfile.header import page_round
from memfree.filterfile.header_fields import MAX_NGRAM_SIZE
from memfree.filterfile.index_layout import (
    INDEX_LAYOUT,
    IndexShape,
    expected_rate,
    token_bits_for,
)

INDEX_HASH_SCHEME = "horner-fmix64-prefix-index-v1"
_HEX16 = re.compile(r"[0-9a-f]{16}\Z")
_INTS = (
    "n",
    "hash_seed",
    "num_ngrams",
    "vocab_size",
    "token_bits",
    "bucket_bits",
    "section_bits",
    "remainder_bits",
    "max_bucket",
)
_BOUND = (*_INTS, "layout", "hash_scheme", "unit", "sections")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def shape_of(metadata: dict[str, Any]) -> IndexShape:
    """The widths a (checked) header states."""
    return IndexShape(
        metadata["token_bits"],
        metadata["bucket_bits"],
        metadata["section_bits"],
        metadata["remainder_bits"],
    )


def index_digest(metadata: dict[str, Any]) -> str:
    """xxh3-64 binding the sections' checksums to the fields that placed their records."""
    bound = {field: metadata.get(field) for field in _BOUND}
    return xxhash.xxh3_64_hexdigest(json.dumps(bound, sort_keys=True).encode("utf-8"))


def check_index_metadata(metadata: dict[str, Any]) -> str | None:
    """The first problem with a prefix-index header's metadata, or None."""
    if metadata.get("layout") != INDEX_LAYOUT:
        return f"unknown layout {metadata.get('layout')!r}, expected {INDEX_LAYOUT!r}"
    for key in _INTS:
        value = metadata.get(key)
        if not _is_int(value) or value < 0:
            return f"metadata field {key!r} is {value!r}, expected a non-negative integer"
    if metadata.get("hash_scheme") != INDEX_HASH_SCHEME:
        return f"unknown hash scheme {metadata.get('hash_scheme')!r}"
    if not 1 <= metadata["n"] <= MAX_NGRAM_SIZE:
        return f"n is {metadata['n']}, must be in [1, {MAX_NGRAM_SIZE}]"
    if metadata.get("unit", "token") != "token":
        return f"unit is {metadata.get('unit')!r}: the prefix-index layout holds token n-grams"
    if metadata["hash_seed"] >= 1 << 64:
        return f"hash_seed {metadata['hash_seed']} does not fit in 64 bits"
    if metadata["vocab_size"] < 1 or metadata["token_bits"] != token_bits_for(
        metadata["vocab_size"]
    ):
        return f"token_bits {metadata['token_bits']} does not match vocab_size"
    shape = shape_of(metadata)
    problem = shape.problem()
    if problem:
        return problem
    sections = metadata.get("sections")
    if not isinstance(sections, list) or len(sections) != shape.num_sections:
        return f"'sections' must list {shape.num_sections} [records, xxh3] pairs"
    for entry in sections:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not _is_int(entry[0])
            or not 0 <= entry[0] < 1 << 32
            or not isinstance(entry[1], str)
            or not _HEX16.match(entry[1])
        ):
            return f"a section entry is {entry!r}, expected [records, 16 hex digits]"
    if sum(entry[0] for entry in sections) != metadata["num_ngrams"]:
        return "the sections' record counts do not add up to num_ngrams"
    if metadata["max_bucket"] > max((entry[0] for entry in sections), default=0):
        return "max_bucket exceeds every section's records"
    stated = metadata.get("expected_false_positive_rate")
    rate = expected_rate(metadata["num_ngrams"], shape, metadata["vocab_size"])
    if not isinstance(stated, (int, float)) or abs(stated - rate) > 1e-9 + 1e-6 * rate:
        return f"expected_false_positive_rate is {stated!r}, but the header's sizes give {rate:.6g}"
    if metadata.get("hashing_xxh3") != index_digest(metadata):
        return (
            "its hashing parameters (seed, n, widths, sections) are not those its records were "
            "written with: the header was edited"
        )
    return None


def index_offsets(
    data_offset: int, shape: IndexShape, records: Sequence[int]
) -> tuple[int, np.ndarray, int]:
    """(offset of the words, each section's first word, the file's size)."""
    words_offset = data_offset + page_round(shape.directory_entries * 4)
    counts = np.array([shape.section_words(count) for count in records], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    size = words_offset + (int(counts.sum()) + 1) * 8
    return words_offset, starts, size


def section_digest(directory: np.ndarray, words: np.ndarray) -> str:
    """The xxh3-64 a header records for one section: its directory slice, then its words."""
    digest = xxhash.xxh3_64()
    digest.update(np.ascontiguousarray(directory, dtype="<u4").data.cast("B"))
    digest.update(np.ascontiguousarray(words, dtype="<u8").data.cast("B"))
    return digest.hexdigest()


def sections_problem(
    metadata: dict[str, Any], directory: np.ndarray, words: np.ndarray, starts: np.ndarray
) -> str | None:
    """The first section whose bytes disagree with the header, or None: checksum, directory
    shape (from 0, never decreasing, ending at its record count, buckets within max_bucket),
    records inside their buckets' remainders, and the final zero word."""
    shape = shape_of(metadata)
    per_section = shape.buckets_per_section + 1
    for section, (records, recorded) in enumerate(metadata["sections"]):
        dir_slice = directory[section * per_section : (section + 1) * per_section]
        first = int(starts[section])
        word_slice = words[first : first + shape.section_words(records)]
        if section_digest(dir_slice, word_slice) != recorded:
            return f"section {section}: checksum mismatch"
        offsets = dir_slice.astype(np.int64)
        sizes = np.diff(offsets)
        if offsets[0] != 0 or offsets[-1] != records or (sizes < 0).any():
            return f"section {section}: its directory does not count its {records} records"
        if sizes.size and int(sizes.max()) > metadata["max_bucket"]:
            return f"section {section}: a bucket holds more than max_bucket records"
    if words[-1] != 0:
        return "the records do not end with a zero word"
    return None


__all__ = [
    "INDEX_HASH_SCHEME",
    "check_index_metadata",
    "index_digest",
    "index_offsets",
    "section_digest",
    "sections_problem",
    "shape_of",
]
