"""Writing a prefix-index file section by section: each section's bytes go to their own place in
the temporary file, from any process (:class:`SectionTarget` pickles), so a builder's reduce
partitions write their own slices and the driver writes only the header (:class:`IndexFileWriter`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from memfree.fileio import PendingFile
from memfree.filterfile.header import (
    INDEX_FORMAT_VERSION,
    PREAMBLE,
    header_bytes,
    json_bytes,
    page_round,
)
from memfree.filterfile.index.checks import section_block_digests, section_digest
from memfree.filterfile.index.header import (
    INDEX_HASH_SCHEME,
    index_digest,
    index_offsets,
    section_table,
)
from memfree.filterfile.index.layout import INDEX_LAYOUT, EncodedSections, IndexShape, section_words
from memfree.filterfile.index.sizing import Concentration, stated_rates


@dataclass(frozen=True)
class WrittenSections:
    """What one target's task wrote: its sections' records and checksums, its largest bucket."""

    first: int
    records: tuple[int, ...]
    digests: tuple[int, ...]
    max_bucket: int


@dataclass(frozen=True)
class SectionTarget:
    """Where a run of sections goes in a file being written (picklable: any process writes it).

    Attributes:
        temporary: the file being written.
        first: the first section.
        count: how many sections.
        blocks_offset: byte offset of their block checksums.
        directory_offset: byte offset of their directory slice.
        words_offset: byte offset of their first word.
        records: each section's record count, as the file was sized for.
        shape: the file's widths.
    """

    temporary: str
    first: int
    count: int
    blocks_offset: int
    directory_offset: int
    words_offset: int
    records: tuple[int, ...]
    shape: IndexShape

    def write(self, encoded: EncodedSections) -> WrittenSections:
        """Write the sections' directory slice and words in place, read them back, and return
        their checksums.

        Raises:
            ValueError: they do not hold the records the file was sized for.
            OSError: the bytes did not reach the file.
        """
        if encoded.first != self.first or tuple(encoded.records.tolist()) != self.records:
            raise ValueError(
                f"sections {self.first}-{self.first + self.count - 1} encode other record counts "
                "than the file was sized for"
            )
        directory = np.ascontiguousarray(encoded.directory, dtype="<u4")
        words = np.ascontiguousarray(encoded.words, dtype="<u8")
        descriptor = os.open(self.temporary, os.O_RDWR)
        try:
            os.pwrite(descriptor, directory.data.cast("B"), self.directory_offset)
            if words.size:
                os.pwrite(descriptor, words.data.cast("B"), self.words_offset)
            os.fsync(descriptor)
            # Read back: bytes that did not reach the file fail here, in this task, so the
            # driver need not read the whole file again.
            directory = np.frombuffer(
                os.pread(descriptor, directory.nbytes, self.directory_offset), dtype="<u4"
            )
            words = np.frombuffer(
                os.pread(descriptor, words.nbytes, self.words_offset), dtype="<u8"
            )
        finally:
            os.close(descriptor)
        if directory.nbytes != encoded.directory.nbytes or words.size != encoded.words.size:
            raise OSError(f"{self.temporary}: sections {self.first}+ did not read back whole")
        per_section = self.shape.buckets_per_section + 1
        counts = section_words(encoded.records, self.shape.record_bits)
        starts = np.cumsum(counts) - counts
        blocks = [
            section_block_digests(
                self.shape,
                directory[i * per_section : (i + 1) * per_section],
                words[starts[i] : starts[i] + counts[i]],
            )
            for i in range(self.count)
        ]
        table = np.ascontiguousarray(np.concatenate(blocks), dtype="<u8")
        descriptor = os.open(self.temporary, os.O_RDWR)
        try:
            os.pwrite(descriptor, table.data.cast("B"), self.blocks_offset)
            os.fsync(descriptor)
            back = os.pread(descriptor, table.nbytes, self.blocks_offset)
        finally:
            os.close(descriptor)
        if back != table.tobytes():
            raise OSError(f"{self.temporary}: sections {self.first}+ did not read back whole")
        digests = tuple(section_digest(block) for block in blocks)
        return WrittenSections(self.first, self.records, digests, encoded.max_bucket)


class IndexFileWriter:
    """A prefix-index file being written: sized from its sections' record counts, filled by runs
    of sections (:meth:`target`, from any process), then given its section table and header and
    renamed into place (:meth:`commit`).

    Args:
        path: final output path (never left half-written).
        metadata: header fields; must hold ``n``, ``hash_seed`` and ``vocab_size``.
        shape: the widths (:func:`~memfree.filterfile.index.layout.choose_shape`).
        section_records: records of each section, in order.
        concentration: the stored next tokens' (:class:`Concentration`, from the first keys).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        metadata: Mapping[str, Any],
        shape: IndexShape,
        section_records: Sequence[int] | np.ndarray,
        concentration: Concentration,
    ) -> None:
        self.path = Path(path)
        records = np.asarray(section_records, dtype=np.int64)
        problem = shape.problem()
        if problem or records.shape != (shape.num_sections,):
            raise ValueError(f"cannot write {self.path}: {problem or 'one count per section'}")
        total = int(records.sum())
        self.metadata = {
            **metadata,
            "format_version": INDEX_FORMAT_VERSION,
            "layout": INDEX_LAYOUT,
            "hash_scheme": INDEX_HASH_SCHEME,
            "unit": metadata.get("unit", "token"),
            "num_ngrams": total,
            "token_bits": shape.token_bits,
            "bucket_bits": shape.bucket_bits,
            "section_bits": shape.section_bits,
            "remainder_bits": shape.remainder_bits,
            "block_bits": shape.block_bits,
            "sections": shape.num_sections,
            "concentration_sample": concentration.sample,
            "concentration_squares": concentration.squares,
            **stated_rates(
                total,
                shape,
                int(metadata["vocab_size"]),
                concentration.value,
                str(metadata.get("unit", "token")),
            ),
            # Placeholders as wide as any final value: the header's length is fixed here.
            "max_bucket": (1 << 32) - 1,
            "section_table_xxh3": "0" * 16,
            "hashing_xxh3": "0" * 16,
        }
        self.shape = shape
        self.records = records
        data_offset = page_round(PREAMBLE.size + len(json_bytes(self.metadata)))
        self.offsets = index_offsets(data_offset, shape, records)
        self._pending = PendingFile(self.path)
        try:
            with open(self._pending.temporary, "r+b") as out:
                out.truncate(self.offsets.size)
        except BaseException:
            self.abort()
            raise

    def target(self, first: int, count: int) -> SectionTarget:
        """Where sections ``first`` to ``first + count - 1`` go."""
        per_section = self.shape.buckets_per_section + 1
        return SectionTarget(
            str(self._pending.temporary),
            first,
            count,
            self.offsets.blocks + first * self.shape.blocks_per_section * 8,
            self.offsets.directory + first * per_section * 4,
            self.offsets.words + int(self.offsets.word_starts[first]) * 8,
            tuple(self.records[first : first + count].tolist()),
            self.shape,
        )

    def commit(
        self, written: Sequence[WrittenSections], check: Callable[[Path], None] | None = None
    ) -> Path:
        """Write the section table and the header from the targets' results, fsync and rename.

        Args:
            written: every target's result (together, every section once).
            check: called with the complete temporary file before the rename (to open it as
                readers will: :func:`memfree.filterfile.index.reader.verify_written`); an exception
                from it discards the file.
        """
        try:
            digests = np.zeros(self.shape.num_sections, dtype=np.uint64)
            seen = np.zeros(self.shape.num_sections, dtype=bool)
            for result in written:
                span = slice(result.first, result.first + len(result.digests))
                if seen[span].any() or tuple(self.records[span].tolist()) != result.records:
                    raise ValueError(f"sections {result.first}+ were written twice or otherwise")
                seen[span] = True
                digests[span] = result.digests
            if not seen.all():
                raise ValueError(f"{int((~seen).sum())} sections were never written")
            table = section_table(self.records, digests)
            self.metadata["section_table_xxh3"] = xxhash.xxh3_64_hexdigest(table.tobytes())
            self.metadata["max_bucket"] = max((r.max_bucket for r in written), default=0)
            self.metadata["hashing_xxh3"] = index_digest(self.metadata)
            header = header_bytes(self.metadata, INDEX_FORMAT_VERSION, self.offsets.table)
            with open(self._pending.temporary, "r+b") as out:
                out.write(header + table.tobytes())
            if check is not None:
                check(self._pending.temporary)
        except BaseException:
            self.abort()
            raise
        self._pending.commit()
        return self.path

    def abort(self) -> None:
        """Discard the temporary file."""
        self._pending.discard()


__all__ = ["IndexFileWriter", "SectionTarget", "WrittenSections"]
