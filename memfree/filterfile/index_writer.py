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
from memfree.filterfile.header import INDEX_FORMAT_VERSION, MAGIC, PREAMBLE, page_round
from memfree.filterfile.index_header import (
    INDEX_HASH_SCHEME,
    index_digest,
    index_offsets,
    section_digest,
)
from memfree.filterfile.index_layout import (
    INDEX_LAYOUT,
    EncodedSection,
    IndexShape,
    expected_rate,
)
from memfree.filterfile.writer import json_bytes


@dataclass(frozen=True)
class WrittenSection:
    """What a section task wrote: its checksum and its largest bucket."""

    digest: str
    max_bucket: int


@dataclass(frozen=True)
class SectionTarget:
    """Where one section's bytes go in a file being written (picklable: any process writes it)."""

    temporary: str
    section: int
    directory_offset: int
    words_offset: int
    records: int
    shape: IndexShape

    def write(self, encoded: EncodedSection) -> WrittenSection:
        """Write the section's directory slice and words in place; returns their checksum.

        Raises:
            ValueError: the section does not hold the records counted for it.
        """
        if encoded.records != self.records:
            raise ValueError(
                f"section {self.section} encodes {encoded.records} records, {self.records} counted"
            )
        directory = np.ascontiguousarray(encoded.directory, dtype="<u4")
        words = np.ascontiguousarray(encoded.words, dtype="<u8")
        descriptor = os.open(self.temporary, os.O_WRONLY)
        try:
            os.pwrite(descriptor, directory.data.cast("B"), self.directory_offset)
            if words.size:
                os.pwrite(descriptor, words.data.cast("B"), self.words_offset)
        finally:
            os.close(descriptor)
        return WrittenSection(section_digest(directory, words), encoded.max_bucket)


class IndexFileWriter:
    """A prefix-index file being written: sized from its sections' record counts, filled section
    by section (:meth:`target`), then given its header and renamed into place (:meth:`commit`).

    Args:
        path: final output path (never left half-written).
        metadata: header fields; must hold ``n``, ``hash_seed`` and ``vocab_size``.
        shape: the widths (:func:`~memfree.filterfile.index_layout.choose_shape`).
        section_records: records of each section, in order.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        metadata: Mapping[str, Any],
        shape: IndexShape,
        section_records: Sequence[int],
    ) -> None:
        self.path = Path(path)
        problem = shape.problem()
        if problem or len(section_records) != shape.num_sections:
            raise ValueError(f"cannot write {self.path}: {problem or 'one count per section'}")
        total = int(sum(section_records))
        self.metadata = {
            **metadata,
            "format_version": INDEX_FORMAT_VERSION,
            "layout": INDEX_LAYOUT,
            "hash_scheme": INDEX_HASH_SCHEME,
            "unit": "token",
            "num_ngrams": total,
            "token_bits": shape.token_bits,
            "bucket_bits": shape.bucket_bits,
            "section_bits": shape.section_bits,
            "remainder_bits": shape.remainder_bits,
            "expected_false_positive_rate": expected_rate(
                total, shape, int(metadata["vocab_size"])
            ),
            # Placeholders as wide as any final value: the header's length is fixed here.
            "max_bucket": (1 << 32) - 1,
            "sections": [[int(count), "f" * 16] for count in section_records],
            "hashing_xxh3": "0" * 16,
        }
        self.shape = shape
        self._data_offset = page_round(PREAMBLE.size + len(json_bytes(self.metadata)))
        self._words_offset, self._starts, size = index_offsets(
            self._data_offset, shape, section_records
        )
        self._pending = PendingFile(self.path)
        try:
            with open(self._pending.temporary, "r+b") as out:
                out.truncate(size)
        except BaseException:
            self.abort()
            raise

    def target(self, section: int) -> SectionTarget:
        """Where section ``section`` goes."""
        per_section = self.shape.buckets_per_section + 1
        return SectionTarget(
            str(self._pending.temporary),
            section,
            self._data_offset + section * per_section * 4,
            self._words_offset + int(self._starts[section]) * 8,
            int(self.metadata["sections"][section][0]),
            self.shape,
        )

    def commit(
        self, written: Sequence[WrittenSection], check: Callable[[Path], None] | None = None
    ) -> Path:
        """Write the header from the sections' results, fsync and rename into place.

        Args:
            written: each section's result, in order.
            check: called with the complete temporary file before the rename (to open it as
                readers will: :func:`memfree.filterfile.index_file.verify_written`); an exception
                from it discards the file.
        """
        try:
            if len(written) != self.shape.num_sections:
                raise ValueError("one written result per section is needed")
            for entry, result in zip(self.metadata["sections"], written, strict=True):
                entry[1] = result.digest
            self.metadata["max_bucket"] = max((result.max_bucket for result in written), default=0)
            self.metadata["hashing_xxh3"] = index_digest(self.metadata)
            raw = json_bytes(self.metadata)
            header = (
                PREAMBLE.pack(MAGIC, INDEX_FORMAT_VERSION, len(raw), xxhash.xxh3_64_intdigest(raw))
                + raw
            )
            if len(header) > self._data_offset:
                raise RuntimeError("index header grew while writing")
            with open(self._pending.temporary, "r+b") as out:
                out.write(header + b"\x00" * (self._data_offset - len(header)))
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


__all__ = ["IndexFileWriter", "SectionTarget", "WrittenSection"]
