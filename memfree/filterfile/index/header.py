"""The prefix-index file's header: its byte layout, its metadata checked field by field, and the
checks of its sections against it (the layout's records are in
:mod:`memfree.filterfile.index.layout`).

Layout (all integers little-endian)::

    offset 0   the preamble of every native file (magic, format version 2, metadata length and
               its xxh3-64), then the UTF-8 JSON metadata, zero padding to a multiple of 4096
    then       the section table: for each of the 2**p sections, uint64 records and the uint64
               xxh3-64 of its blocks' checksums
    then       the block table: for each section, for each of its 2**(b-p-k) blocks, the uint64
               xxh3-64 of the block's directory entries and the words its records occupy
    then       uint32 directory: for each section, 2**(b-p) + 1 record offsets; padded to a page
    then       uint64 words: each section's packed records from a word boundary, section after
               section, then one zero word

The metadata records the section table's xxh3-64, and ``hashing_xxh3`` binds it to the widths,
seed and n that placed the records, as in the Bloom layout: an edited header with its checksum
recomputed is refused, never read as a filter that finds less. The section table is read and checked at
every open (16 bytes a section, at most 64 KiB); a section's block checksums, and each block,
before their first read when verified (:mod:`memfree.filterfile.index.checks`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import xxhash

from memfree.filterfile.header import GUARD_FIELDS, MAX_NGRAM_SIZE, FilterHeader, page_round
from memfree.filterfile.index.layout import INDEX_LAYOUT, IndexShape, section_words, token_bits_for
from memfree.filterfile.index.sizing import Concentration, stated_rates

INDEX_HASH_SCHEME = "horner-fmix64-prefix-index-v1"
_HEX16 = re.compile(r"[0-9a-f]{16}\Z")
TABLE_ENTRY = np.dtype([("records", "<u8"), ("digest", "<u8")])
_INTS = (
    "n",
    "hash_seed",
    "num_ngrams",
    "vocab_size",
    "token_bits",
    "bucket_bits",
    "section_bits",
    "remainder_bits",
    "block_bits",
    "max_bucket",
    "sections",
    "concentration_sample",
    "concentration_squares",
)
_BOUND = (*_INTS, "layout", "hash_scheme", "unit", "section_table_xxh3", *GUARD_FIELDS)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class IndexHeader(FilterHeader):
    """The prefix-keyed index's header (:class:`~memfree.filterfile.header.FilterHeader`, and
    what its lookups need).

    Attributes:
        hash_seed: the seed of the prefix fingerprints.
        shape: the widths.
        max_bucket: most records in one bucket.
        concentration: the stored next tokens' concentration, as measured when it was built.
        uniform_false_positive_rate: false bans per candidate of a whole-vocabulary row.
        prefix_collision_rate: the most any query can meet (a prefix collision).
    """

    hash_seed: int
    shape: IndexShape
    max_bucket: int
    concentration: Concentration
    uniform_false_positive_rate: float
    prefix_collision_rate: float

    @classmethod
    def read(cls, metadata: dict[str, Any]) -> IndexHeader:
        """The header of metadata :func:`check_index_metadata` passed."""
        header: IndexHeader = cls.of(
            metadata,
            hash_seed=int(metadata["hash_seed"]),
            shape=shape_of(metadata),
            max_bucket=int(metadata["max_bucket"]),
            concentration=concentration_of(metadata),
            uniform_false_positive_rate=float(metadata["uniform_false_positive_rate"]),
            prefix_collision_rate=float(metadata["prefix_collision_rate"]),
        )
        return header


def shape_of(metadata: dict[str, Any]) -> IndexShape:
    """The widths a (checked) header states."""
    return IndexShape(
        metadata["token_bits"],
        metadata["bucket_bits"],
        metadata["section_bits"],
        metadata["remainder_bits"],
        metadata["block_bits"],
    )


def concentration_of(metadata: dict[str, Any]) -> Concentration:
    """The stored next tokens' concentration a (checked) header states."""
    return Concentration(metadata["concentration_sample"], metadata["concentration_squares"])


def index_digest(metadata: dict[str, Any]) -> str:
    """xxh3-64 binding the sections' checksums to the fields that placed their records, and to
    every field the guard relies on (tokenizer fingerprint, special tokens, normalizer)."""
    bound = {field: metadata.get(field) for field in _BOUND}
    return xxhash.xxh3_64_hexdigest(json.dumps(bound, sort_keys=True).encode("utf-8"))


def check_index_metadata(metadata: dict[str, Any]) -> str | None:
    """The first problem with a prefix-index header's metadata, or None."""
    if metadata.get("layout") != INDEX_LAYOUT:
        return f"unknown layout {metadata.get('layout')!r}, expected {INDEX_LAYOUT!r}"
    if "block_bits" not in metadata:
        return (
            "no block_bits: written by a development build of memfree before blocks had "
            "checksums; rebuild the filter with this version"
        )
    if "concentration_sample" not in metadata:
        return (
            "no concentration_sample: written by an earlier memfree, whose stated rate assumed "
            "uniformly drawn tokens (natural text meets ~100x more false bans); rebuild the "
            "filter with this version"
        )
    for key in _INTS:
        value = metadata.get(key)
        if not _is_int(value) or value < 0:
            return f"metadata field {key!r} is {value!r}, expected a non-negative integer"
    if metadata.get("hash_scheme") != INDEX_HASH_SCHEME:
        return f"unknown hash scheme {metadata.get('hash_scheme')!r}"
    if not 1 <= metadata["n"] <= MAX_NGRAM_SIZE:
        return f"n is {metadata['n']}, must be in [1, {MAX_NGRAM_SIZE}]"
    if metadata.get("unit", "token") not in ("token", "word"):
        unit = metadata.get("unit")
        return f"unit is {unit!r}: the prefix-index layout holds token or word n-grams"
    if metadata["hash_seed"] >= 1 << 64:
        return f"hash_seed {metadata['hash_seed']} does not fit in 64 bits"
    if metadata["vocab_size"] < 1 or metadata["token_bits"] != token_bits_for(
        metadata["vocab_size"]
    ):
        return f"token_bits {metadata['token_bits']} does not match vocab_size"
    if metadata.get("unit") == "word" and metadata["vocab_size"] != 1 << metadata["token_bits"]:
        return "a word index's vocab_size must be 2**token_bits (the next-word field's values)"
    shape = shape_of(metadata)
    problem = shape.problem()
    if problem:
        return problem
    if metadata["sections"] != shape.num_sections:
        return f"sections is {metadata['sections']}, the widths make {shape.num_sections}"
    if not isinstance(metadata.get("section_table_xxh3"), str) or not _HEX16.match(
        metadata["section_table_xxh3"]
    ):
        return "section_table_xxh3 is not 16 hex digits"
    concentration = concentration_of(metadata)
    problem = concentration.problem(metadata["num_ngrams"])
    if problem:
        return problem
    rates = stated_rates(
        metadata["num_ngrams"],
        shape,
        metadata["vocab_size"],
        concentration.value,
        metadata.get("unit", "token"),
    )
    for key, rate in rates.items():
        stated = metadata.get(key)
        if not isinstance(stated, (int, float)) or abs(stated - rate) > 1e-9 + 1e-6 * rate:
            return f"{key} is {stated!r}, but the header's sizes give {rate:.6g}"
    if metadata.get("hashing_xxh3") != index_digest(metadata):
        return (
            "its hashing parameters (seed, n, widths, sections) or the fields the guard relies "
            "on (tokenizer fingerprint, special tokens, normalizer) are not those its records "
            "were written with: the header was edited, or written by an earlier memfree "
            "(rebuild it with this version)"
        )
    return None


@dataclass(frozen=True)
class IndexOffsets:
    """Where an index file's parts start, and its size."""

    table: int
    blocks: int
    directory: int
    words: int
    word_starts: np.ndarray  # int64 (sections,) each section's first word
    size: int


def index_offsets(data_offset: int, shape: IndexShape, records: np.ndarray) -> IndexOffsets:
    """The offsets of a file whose header ends at ``data_offset``, sections of ``records``."""
    blocks = data_offset + shape.num_sections * TABLE_ENTRY.itemsize
    directory = blocks + shape.num_blocks * 8
    words_offset = data_offset + page_round(directory - data_offset + shape.directory_entries * 4)
    words = section_words(records, shape.record_bits)
    starts = (np.cumsum(words) - words).astype(np.int64)
    size = words_offset + (int(words.sum()) + 1) * 8
    return IndexOffsets(data_offset, blocks, directory, words_offset, starts, size)


def section_table(records: np.ndarray, digests: np.ndarray) -> np.ndarray:
    """The section table's entries (structured ``TABLE_ENTRY`` array)."""
    table = np.zeros(len(records), dtype=TABLE_ENTRY)
    table["records"] = records
    table["digest"] = digests
    return table


def table_problem(metadata: dict[str, Any], table: np.ndarray) -> str | None:
    """Why a section table read from a file disagrees with its header, or None."""
    if xxhash.xxh3_64_hexdigest(table.tobytes()) != metadata["section_table_xxh3"]:
        return "section table checksum mismatch"
    records = table["records"]
    if records.size and int(records.max()) >= 1 << 32:
        return "a section counts more records than a section holds"
    if int(records.sum(dtype=np.uint64)) != metadata["num_ngrams"]:
        return "the sections' record counts do not add up to num_ngrams"
    return None


__all__ = [
    "INDEX_HASH_SCHEME",
    "TABLE_ENTRY",
    "IndexOffsets",
    "check_index_metadata",
    "concentration_of",
    "index_digest",
    "index_offsets",
    "section_table",
    "shape_of",
    "table_problem",
]
