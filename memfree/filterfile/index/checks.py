"""Checking a prefix-index file's records: block by block, before their first read.

A section's buckets form blocks of ``2**block_bits`` (:class:`~memfree.filterfile.index.layout.
IndexShape`). Each block's checksum (in the block table) covers its directory entries (its
buckets' first records and the next block's first) and the words its records occupy; a
section's checksum (in the section table, itself bound to the header) covers its blocks'
checksums. So a reader that is about to read a bucket checks, once, its section's block
checksums (8 bytes a block) and its block (at most about 2**10 buckets of records): what it
checks grows with what it reads, never with the file. A damaged block is refused when first
touched (:class:`~memfree.errors.DamagedFilterError`), never read as a filter that finds less.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash

from memfree.filterfile.header import damaged_error
from memfree.filterfile.index.header import IndexHeader
from memfree.filterfile.index.layout import IndexShape


def block_digest(directory: np.ndarray, words: np.ndarray) -> int:
    """The xxh3-64 of one block: its directory entries, then its records' words."""
    digest = xxhash.xxh3_64()
    digest.update(np.ascontiguousarray(directory, dtype="<u4").data.cast("B"))
    digest.update(np.ascontiguousarray(words, dtype="<u8").data.cast("B"))
    return digest.intdigest()


def block_words(shape: IndexShape, entries: np.ndarray) -> tuple[int, int]:
    """The words (local to the section) that hold the records between a block's first and last
    directory entries: ``[first, end)``."""
    width = shape.record_bits
    return int(entries[0]) * width // 64, (int(entries[-1]) * width + 63) // 64


def section_block_digests(
    shape: IndexShape, directory: np.ndarray, words: np.ndarray
) -> np.ndarray:
    """The block checksums (uint64) of one section, from its directory slice and its words."""
    per_block = shape.buckets_per_block
    digests = np.zeros(shape.blocks_per_section, dtype=np.uint64)
    for block in range(shape.blocks_per_section):
        entries = directory[block * per_block : (block + 1) * per_block + 1]
        first, end = block_words(shape, entries)
        digests[block] = block_digest(entries, words[first:end])
    return digests


def section_digest(block_digests: np.ndarray) -> int:
    """The section table's checksum of a section: the xxh3-64 of its block checksums."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(block_digests, dtype="<u8").tobytes())


class BlockChecks:
    """Checks each block of an open index before its first read (then never again).

    Called with the buckets a lookup is about to read. Opening reads only the header and the
    section table, whatever the file's size; ``memfree info`` and writers check every block.

    Args:
        path: the file (named in errors).
        metadata: its checked header.
        table: its section table (checked at open).
        blocks: its block table (uint64, one per block), memory-mapped.
        directory: its directory, memory-mapped.
        words: its records' words, memory-mapped.
        starts: each section's first word.
    """

    def __init__(
        self,
        path: Path,
        header: IndexHeader,
        table: np.ndarray,
        blocks: np.ndarray,
        directory: np.ndarray,
        words: np.ndarray,
        starts: np.ndarray,
    ) -> None:
        self.path = path
        self.shape = header.shape
        self.max_bucket = header.max_bucket
        self.records = table["records"].astype(np.int64)
        self.section_digests = table["digest"]
        self.blocks = blocks
        self.directory = directory
        self.words = words
        self.starts = starts
        self.sections_done = np.zeros(self.shape.num_sections, dtype=bool)
        self.done = np.zeros(self.shape.num_blocks, dtype=bool)

    def __call__(self, buckets: np.ndarray) -> None:
        """Check the blocks not yet checked that hold ``buckets`` (int array)."""
        buckets = np.asarray(buckets, dtype=np.int64)
        if not buckets.size:
            return
        blocks = np.clip(buckets >> self.shape.block_bits, 0, self.done.size - 1)
        pending = blocks[~self.done[blocks]]
        if pending.size:
            self._raise_on(self.check(np.unique(pending)))

    def all(self) -> None:
        """Check every block not yet checked."""
        self._raise_on(self.check(np.flatnonzero(~self.done)))

    def _raise_on(self, problem: str | None) -> None:
        if problem:
            raise damaged_error(self.path, problem)

    def check(self, blocks: np.ndarray) -> str | None:
        """Check the given blocks (and their sections' block checksums); the first problem, or
        None. Checked blocks are not checked again."""
        per_section = self.shape.blocks_per_section
        for block in np.asarray(blocks, dtype=np.int64).tolist():
            section = block // per_section
            if not self.sections_done[section]:
                listed = self.blocks[section * per_section : (section + 1) * per_section]
                if section_digest(listed) != int(self.section_digests[section]):
                    return f"section {section}: checksum mismatch (its block checksums)"
                self.sections_done[section] = True
            problem = self._block_problem(section, block - section * per_section)
            if problem:
                return problem
            self.done[block] = True
        return None

    def _block_problem(self, section: int, local: int) -> str | None:
        """Why one block's bytes disagree with its checksum and the header, or None: its
        directory entries (from 0 in the section's first block, never decreasing, no bucket above
        max_bucket, ending at the section's record count in its last), then its checksum."""
        shape = self.shape
        per_block = shape.buckets_per_block
        start = section * (shape.buckets_per_section + 1) + local * per_block
        entries = np.asarray(self.directory[start : start + per_block + 1], dtype=np.int64)
        records = int(self.records[section])
        sizes = np.diff(entries)
        where = f"section {section}, block {local}"
        if (
            entries.shape[0] != per_block + 1
            or (sizes < 0).any()
            or int(entries[-1]) > records
            or (local == 0 and entries[0] != 0)
            or (local == shape.blocks_per_section - 1 and entries[-1] != records)
        ):
            return f"{where}: its directory does not count its section's {records} records"
        if sizes.size and int(sizes.max()) > self.max_bucket:
            return f"{where}: a bucket holds more than max_bucket records"
        first, end = block_words(shape, entries)
        base = int(self.starts[section])
        digest = block_digest(entries.astype("<u4"), self.words[base + first : base + end])
        if digest != int(self.blocks[section * shape.blocks_per_section + local]):
            return f"{where}: checksum mismatch"
        return None

    def problem(self) -> str | None:
        """The first block (checked or not) whose bytes disagree now, then the final zero word,
        or None (a fresh pass over the whole file: for a file that may have changed)."""
        fresh = BlockChecks.__new__(BlockChecks)
        fresh.__dict__.update(self.__dict__)
        fresh.sections_done = np.zeros_like(self.sections_done)
        fresh.done = np.zeros_like(self.done)
        problem = fresh.check(np.arange(self.done.size))
        if problem:
            return problem
        if self.words[-1] != 0:
            return "the records do not end with a zero word"
        return None


__all__ = [
    "BlockChecks",
    "block_digest",
    "block_words",
    "section_block_digests",
    "section_digest",
]
