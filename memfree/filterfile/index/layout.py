"""The prefix-keyed index layout (``prefix-index-v1``): for each stored n-gram, a fingerprint of
its (n-1)-prefix and its next token, sorted by prefix and packed, so that a guard answers a row
with one lookup that returns the tokens to ban instead of testing every vocabulary token.

Keys. An n-gram's key is ``(prefix_fingerprint with its low t bits cleared) | next_token``: the
prefix's 64-bit fingerprint (:func:`~memfree.filterfile.hashing.fingerprints_np` of its n-1 ids)
above a t-bit token id (t bits hold every id of the vocabulary). Sorting keys sorts by prefix;
a range of the key space is a range of prefixes, so the builder's reduce partitions are the
file's sections and each writes its own slice. A word index (``unit`` "word") keys the same way
on word n-grams: the prefix is the fingerprint of the first n-1 word hashes, and the t-bit field
holds the low t bits of the next word's hash (:func:`word_token_bits`, from the target rate), so
a candidate word after a stored prefix also matches by chance with probability ``2**-t`` per
stored next word.

Buckets and records. The top ``b`` bits of a key pick its bucket (``2**b`` buckets, about
:data:`BUCKET_TARGET` records each); a section holds ``2**(b - p)`` consecutive buckets (``2**p``
sections, ``p = min(b, 12)``: fixed by the number of records, so the file does not depend on how
the builder partitioned its work). Each record keeps the next ``R`` bits of the prefix fingerprint (its remainder) and the
token, ``R + t`` bits packed end to end in little-endian uint64 words. A row's prefix picks its
bucket; the records of that bucket whose remainder equals the row's are the tokens it bans.

No false negatives: every stored n-gram's record sits in its prefix's bucket with its prefix's
remainder. A false positive needs another prefix with the same top ``b + R`` bits (a prefix
collision, about ``records_per_bucket * 2**-R``), and then only that prefix's few tokens are
banned. Which tokens those are is not random: the stored n-grams' next tokens are the corpus's
common ones (a newline, a space, a parenthesis), and so is the token a model is about to write. So
R is sized for a *natural* query, one whose token follows the corpus's own distribution: it is
banned falsely with probability about ``records_per_bucket * 2**-R * concentration``, the
concentration measured by the builder (8.8e-3 for the stdlib's 10-grams under SmolLM2, against
``1 / 49,152`` for a token drawn uniformly; :mod:`memfree.filterfile.index.sizing` sizes the
widths). Sizing for uniform tokens stated 5e-6 while natural text met 2e-3.

The directory holds, for each section, ``2**(b - p) + 1`` uint32 record offsets (each bucket's
first record, local to its section, then the section's record count); a section's records start
at a word boundary, so every run of sections is a contiguous slice of the directory and one of
the records, which one task encodes and writes. A section's buckets form blocks of
``2**block_bits``, each with its own checksum (:mod:`memfree.filterfile.index.checks`), so a
reader checks what it reads, a block at a time, and never a whole section of a large file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INDEX_LAYOUT = "prefix-index-v1"
#: Records per bucket the builder aims for (the directory then costs 2 bits per record).
BUCKET_TARGET = 16
#: A record is read from two adjacent words; a field of up to 57 bits always fits.
MAX_RECORD_BITS = 57
#: A section's records are counted in uint32 directory entries.
MAX_SECTION_RECORDS = (1 << 32) - 1
#: At most 2**12 sections (the builder's largest partition count).
MAX_SECTION_BITS = 12
#: A reader checks a section's buckets in blocks of up to 2**10 (about 16k records, 40-60 KB):
#: the most a first read of a bucket makes it check, whatever the file's size.
BLOCK_BITS = 10

_U1 = np.uint64(1)
_U6 = np.uint64(6)
_U63 = np.uint64(63)


def token_bits_for(vocab_size: int) -> int:
    """Bits that hold every token id below ``vocab_size`` (at least 1)."""
    return max(1, (int(vocab_size) - 1).bit_length())


def index_keys(prefix_fingerprints: np.ndarray, tokens: np.ndarray, token_bits: int) -> np.ndarray:
    """The index keys (uint64) of n-grams given their prefixes' fingerprints and next tokens."""
    low = np.uint64((1 << token_bits) - 1)
    prefix = np.asarray(prefix_fingerprints, dtype=np.uint64) & ~low
    return prefix | (np.asarray(tokens).astype(np.uint64) & low)


@dataclass(frozen=True)
class IndexShape:
    """The bit widths of an index file.

    Attributes:
        token_bits: t, bits of a token id.
        bucket_bits: b, bits of a key that pick its bucket.
        section_bits: p = min(b, 12), bits that pick its section.
        remainder_bits: R, prefix bits a record keeps below the bucket's.
        block_bits: each section's buckets are checked in blocks of ``2**block_bits`` (at most
            ``b - p``; :data:`BLOCK_BITS` by default): the unit a reader verifies before its
            first read.
    """

    token_bits: int
    bucket_bits: int
    section_bits: int
    remainder_bits: int
    block_bits: int = 0

    @property
    def record_bits(self) -> int:
        return self.remainder_bits + self.token_bits

    @property
    def num_sections(self) -> int:
        return 1 << self.section_bits

    @property
    def buckets_per_section(self) -> int:
        return 1 << (self.bucket_bits - self.section_bits)

    @property
    def buckets_per_block(self) -> int:
        return 1 << self.block_bits

    @property
    def blocks_per_section(self) -> int:
        return 1 << (self.bucket_bits - self.section_bits - self.block_bits)

    @property
    def num_blocks(self) -> int:
        return self.num_sections * self.blocks_per_section

    @property
    def directory_entries(self) -> int:
        return self.num_sections * (self.buckets_per_section + 1)

    def section_words(self, records: int) -> int:
        """uint64 words that hold ``records`` packed records."""
        return (records * self.record_bits + 63) // 64

    def problem(self) -> str | None:
        """The first inconsistency of these widths, or None."""
        t, b, p, r = self.token_bits, self.bucket_bits, self.section_bits, self.remainder_bits
        k = self.block_bits
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (t, b, p, r, k)):
            return "index widths must be integers"
        if not 1 <= t <= 40:
            return f"token_bits is {t}, must be in [1, 40]"
        if b < 0 or p != min(b, MAX_SECTION_BITS):
            return (
                f"section_bits is {p}, must be min(bucket_bits, {MAX_SECTION_BITS}) = {min(b, 12)}"
            )
        if b - p > 31:
            return f"bucket_bits {b} gives more than 2**31 buckets per section"
        if not 0 <= k <= b - p:
            return f"block_bits is {k}, must be in [0, bucket_bits - section_bits = {b - p}]"
        if r < 0 or b + r + t > 64 or r + t > MAX_RECORD_BITS:
            return (
                f"remainder_bits {r} with bucket_bits {b} and token_bits {t} do not fit a 64-bit "
                f"key and a {MAX_RECORD_BITS}-bit record"
            )
        return None


# ---------------------------------------------------------------------------------------------
# Writing one section.


@dataclass(frozen=True)
class EncodedSections:
    """A run of consecutive sections, encoded: one contiguous slice of the directory, one of the
    words, and each section's entry of the section table.

    Attributes:
        first: the first section's number.
        directory: uint32 `(count * (buckets_per_section + 1),)`.
        words: uint64 packed records, each section's from a word boundary.
        records: int64 `(count,)` records of each section.
        max_bucket: most records in one of their buckets.
    """

    first: int
    directory: np.ndarray
    words: np.ndarray
    records: np.ndarray
    max_bucket: int


def section_words(records: np.ndarray, width: int) -> np.ndarray:
    """uint64 words of each section (int64): its records packed, rounded up to a word."""
    return (np.asarray(records, dtype=np.int64) * width + 63) // 64


def encode_sections(keys: np.ndarray, first: int, count: int, shape: IndexShape) -> EncodedSections:
    """Encode the sorted keys of sections ``first`` to ``first + count - 1``.

    Raises:
        ValueError: keys out of order or outside those sections, or a section of more than
            2**32 - 1 records.
    """
    keys = np.asarray(keys, dtype=np.uint64)
    per_section = shape.buckets_per_section
    if keys.size and np.any(keys[1:] < keys[:-1]):
        raise ValueError(f"sections {first}+: keys are not sorted")
    buckets = top_bits(keys, shape.bucket_bits).astype(np.int64) - first * per_section
    if keys.size and (buckets[0] < 0 or buckets[-1] >= count * per_section):
        raise ValueError(f"sections {first}+: a key lies outside their range")
    counts = np.bincount(buckets, minlength=count * per_section).reshape(count, per_section)
    records = counts.sum(axis=1)
    if records.size and int(records.max()) > MAX_SECTION_RECORDS:
        raise ValueError(f"sections {first}+: a section holds more than 2**32 - 1 records")
    directory = np.zeros((count, per_section + 1), dtype=np.uint32)
    directory[:, 1:] = np.cumsum(counts, axis=1)
    width = shape.record_bits
    values = keys & np.uint64((1 << shape.token_bits) - 1)
    if shape.remainder_bits:
        remainders = keys >> np.uint64(64 - shape.bucket_bits - shape.remainder_bits)
        remainders &= np.uint64((1 << shape.remainder_bits) - 1)
        values |= remainders << np.uint64(shape.token_bits)
    words = section_words(records, width)
    word_starts = np.cumsum(words) - words
    record_starts = np.cumsum(records) - records
    sections = buckets // per_section
    local = np.arange(keys.size, dtype=np.int64) - record_starts[sections]
    offsets = (word_starts[sections] * 64 + local * width).astype(np.uint64)
    return EncodedSections(
        first=first,
        directory=directory.reshape(-1),
        words=pack_fields(values, width, offsets, int(words.sum())),
        records=records.astype(np.int64),
        max_bucket=int(counts.max()) if counts.size else 0,
    )


def top_bits(keys: np.ndarray, bits: int) -> np.ndarray:
    """The top ``bits`` bits of each key (zeros when ``bits`` is 0)."""
    if bits == 0:
        return np.zeros(keys.shape[0], dtype=np.uint64)
    return keys >> np.uint64(64 - bits)


def pack_fields(
    values: np.ndarray, width: int, offsets: np.ndarray | None = None, num_words: int = -1
) -> np.ndarray:
    """Pack uint64 values of ``width`` bits into little-endian uint64 words, at increasing bit
    ``offsets`` (default: end to end); ``num_words`` words (default: as few as hold them)."""
    count = int(values.shape[0])
    if offsets is None:
        offsets = np.arange(count, dtype=np.uint64) * np.uint64(width)
    if num_words < 0:
        num_words = (count * width + 63) // 64
    words = np.zeros(num_words + 1, dtype=np.uint64)
    if count:
        index = (offsets >> _U6).astype(np.int64)
        shifts = offsets & _U63
        starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
        words[index[starts]] = np.bitwise_or.reduceat(values << shifts, starts)
        crossing = np.flatnonzero(shifts + np.uint64(width) > np.uint64(64))
        if crossing.size:  # at most one field crosses into each word: plain fancy indexing
            spill = (values[crossing] >> _U1) >> (np.uint64(63) - shifts[crossing])
            words[index[crossing] + 1] |= spill
    return words[:-1]


__all__ = [
    "BLOCK_BITS",
    "BUCKET_TARGET",
    "INDEX_LAYOUT",
    "MAX_RECORD_BITS",
    "MAX_SECTION_BITS",
    "MAX_SECTION_RECORDS",
    "EncodedSections",
    "IndexShape",
    "encode_sections",
    "index_keys",
    "pack_fields",
    "section_words",
    "token_bits_for",
    "top_bits",
]
