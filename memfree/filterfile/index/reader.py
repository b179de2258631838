"""Reading prefix-index filter files (``prefix-index-v1``; the records in
:mod:`memfree.filterfile.index.layout`, the header in :mod:`memfree.filterfile.index.header`).

:class:`IndexFilter` answers the :class:`~memfree.filterfile.protocol.NgramSet` protocol and hands
the guard core its arrays (:meth:`IndexFilter.prefix_index`); :func:`open_index` opens and
validates a file. Writing is in :mod:`memfree.filterfile.index.writer`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memfree.errors import DamagedFilterError
from memfree.filterfile.face import NgramFilter
from memfree.filterfile.filewatch import FileIdentity, FileWatch
from memfree.filterfile.hashing import DEFAULT_HASH_SEED, fingerprints_np
from memfree.filterfile.header import (
    INDEX_FORMAT_VERSION,
    PREAMBLE,
    damaged_error,
    read_metadata,
)
from memfree.filterfile.index.checks import BlockChecks
from memfree.filterfile.index.header import (
    TABLE_ENTRY,
    IndexHeader,
    check_index_metadata,
    index_offsets,
    table_problem,
)
from memfree.filterfile.index.layout import (
    IndexShape,
    encode_sections,
    index_keys,
    token_bits_for,
)
from memfree.filterfile.index.query import IndexArrays, contains_keys, lookup
from memfree.filterfile.index.sizing import Concentration, choose_shape, word_shape, word_token_bits

#: The index's default target: false bans per natural query (the Bloom layout's default is 1e-3).
DEFAULT_INDEX_FALSE_POSITIVE_RATE = 1e-5


class IndexFilter(NgramFilter):
    """A read-only set of n-grams in the prefix-keyed index layout (the default build),
    memory-mapped.

    Open with :meth:`NgramFilter.open <memfree.filterfile.NgramFilter.open>`; write a small one
    with :meth:`from_ngrams`. Queries never produce false negatives.
    """

    def __init__(
        self,
        path: Path,
        metadata: dict[str, Any],
        arrays: IndexArrays,
        checks: BlockChecks | None = None,
    ) -> None:
        self.path = path
        self._checks = checks
        self._arrays = arrays
        self.header = header = IndexHeader.read(metadata)
        self.n: int = header.n
        self.hash_seed: int = header.hash_seed
        self.num_ngrams: int = header.num_ngrams
        self.file_watch: FileWatch | None = None

    @classmethod
    def from_ngrams(  # type: ignore[override]  # each layout takes its own arguments
        cls,
        path: str | os.PathLike[str],
        ngrams: np.ndarray | list[list[int]],
        *,
        vocab_size: int,
        false_positive_rate: float = DEFAULT_INDEX_FALSE_POSITIVE_RATE,
        hash_seed: int = DEFAULT_HASH_SEED,
        metadata: Mapping[str, Any] | None = None,
    ) -> IndexFilter:
        """Write an index holding exactly the given n-grams (ids below ``vocab_size``) and open it."""
        array = np.asarray(ngrams, dtype=np.int64)
        if array.ndim != 2 or array.shape[1] < 1:
            raise ValueError(f"ngrams must be a 2-D (N, n) array, got shape {array.shape}")
        if array.size and (array.min() < 0 or array.max() >= vocab_size):
            raise ValueError(f"ngrams must hold token ids in [0, {vocab_size})")
        bits = token_bits_for(vocab_size)
        return _write_small(
            path,
            array,
            bits,
            lambda keys, spread: choose_shape(keys, bits, false_positive_rate, spread),
            false_positive_rate,
            hash_seed,
            {**(metadata or {}), "vocab_size": int(vocab_size)},
        )

    @classmethod
    def from_word_ngrams(
        cls,
        path: str | os.PathLike[str],
        word_hashes: np.ndarray,
        *,
        false_positive_rate: float = DEFAULT_INDEX_FALSE_POSITIVE_RATE,
        hash_seed: int = DEFAULT_HASH_SEED,
        metadata: Mapping[str, Any] | None = None,
    ) -> IndexFilter:
        """Write a word index holding exactly the given word n-grams (uint64 `(N, n)` rows of
        word hashes, :func:`memfree.vocab.words.ngram_hash_rows`) and open it. ``metadata``
        should hold the word unit's fields (:func:`memfree.vocab.words.word_metadata`)."""
        array = np.asarray(word_hashes, dtype=np.uint64)
        if array.ndim != 2 or array.shape[1] < 1:
            raise ValueError(f"word_hashes must be a 2-D (N, n) array, got shape {array.shape}")
        bits = word_token_bits(false_positive_rate)
        header = {**(metadata or {}), "unit": "word", "vocab_size": 1 << bits}
        return _write_small(
            path,
            array,
            bits,
            lambda keys, spread: word_shape(keys, false_positive_rate, spread),
            false_positive_rate,
            hash_seed,
            header,
        )

    # -- queries ----------------------------------------------------------------------------------

    def next_tokens(self, prefixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored next tokens of each (n-1)-token prefix: (row, token) int64 arrays (for a
        word index, rows of n-1 word hashes, and the low ``token_bits`` bits of each stored next
        word's hash)."""
        array = np.asarray(prefixes)
        array = array.astype(np.uint64 if self.unit == "word" else np.int64)
        return lookup(self._arrays, fingerprints_np(array, self.hash_seed))

    def contains(self, ngrams: np.ndarray | list[list[int]]) -> np.ndarray:
        """Whether each n-gram is (probably) stored; never a false negative. Token ids, or for a
        word index uint64 word hashes (:func:`memfree.vocab.words.ngram_hash_rows`)."""
        array, single = self.query_rows(ngrams)
        if array.size and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0):
            raise ValueError("ngrams must hold non-negative integer token ids")
        array = array.astype(np.uint64 if self.unit == "word" else np.int64)
        prefixes = fingerprints_np(array[:, :-1], self.hash_seed)
        result = contains_keys(self._arrays, prefixes, array[:, -1])
        return result[0] if single else result

    def verify(self) -> None:
        """Check every block now (opening checks only the header and the section table; each
        block is otherwise checked before its first read).

        Raises:
            DamagedFilterError: a block's bytes disagree with its checksums or the header.
        """
        if self._checks is None:
            raise DamagedFilterError(f"{self.path}: closed, or a copy with no file to verify")
        self._checks.all()

    def prefix_index(self) -> IndexArrays:
        """The arrays and widths, for the guard core."""
        return self._arrays

    def blocked_bits(self) -> None:
        """None: this layout holds no Bloom bits."""
        return None

    # -- properties -------------------------------------------------------------------------------

    def __repr__(self) -> str:
        shape = self._arrays.shape
        return (
            f"IndexFilter({str(self.path)!r}, n={self.n}, num_ngrams={self.num_ngrams}, "
            f"record_bits={shape.record_bits}, expected_fpr={self.expected_false_positive_rate:.3g})"
        )

    def close(self) -> None:
        """Drop the mapping (queries after this fail)."""
        for array in (self._arrays.directory, self._arrays.words):
            mapping = getattr(array, "_mmap", None)
            if mapping is not None:
                try:
                    mapping.close()
                except BufferError:
                    return  # a view still uses it; it closes with that view
        if self.file_watch is not None:
            self.file_watch.close()

    def __enter__(self) -> IndexFilter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_index(path: Path, verify: bool) -> IndexFilter:
    """Open, map and validate a prefix-index file.

    The header, the section table (16 bytes a section) and the final word are always checked;
    with ``verify`` each block too, before its first read (:class:`BlockChecks`), so opening
    costs the same for any size of file and no unchecked byte is ever read.

    Raises:
        DamagedFilterError: the file is truncated, damaged, edited or not a filter.
    """
    handle = open(path, "rb")  # noqa: SIM115 - kept open by the watch while mapped
    try:
        identity = FileIdentity.of(os.fstat(handle.fileno()))
        head = os.pread(handle.fileno(), PREAMBLE.size, 0)
        metadata, data_offset = read_metadata(
            path, head, identity.size_bytes, handle, INDEX_FORMAT_VERSION
        )
        problem = check_index_metadata(metadata)
        if problem:
            raise damaged_error(path, problem)
        fields = IndexHeader.read(metadata)
        shape = fields.shape
        table_bytes = shape.num_sections * TABLE_ENTRY.itemsize
        raw_table = os.pread(handle.fileno(), table_bytes, data_offset)
        if len(raw_table) < table_bytes:
            raise damaged_error(path, f"only {identity.size_bytes} bytes, no room for its sections")
        table = np.frombuffer(raw_table, dtype=TABLE_ENTRY)
        problem = table_problem(metadata, table)
        if problem:
            raise damaged_error(path, problem)
        offsets = index_offsets(data_offset, shape, table["records"])
        if identity.size_bytes != offsets.size:
            raise damaged_error(
                path, f"size {identity.size_bytes} bytes, expected {offsets.size} from its header"
            )
        header = os.pread(handle.fileno(), offsets.blocks, 0)  # the header and the table
        blocks = _mapped(handle, "<u8", offsets.blocks, shape.num_blocks)
        directory = _mapped(handle, "<u4", offsets.directory, shape.directory_entries)
        words = _mapped(handle, "<u8", offsets.words, (offsets.size - offsets.words) // 8)
        if words[-1] != 0:
            raise damaged_error(path, "the records do not end with a zero word")
        checks = BlockChecks(path, fields, table, blocks, directory, words, offsets.word_starts)
    except BaseException:
        handle.close()
        raise
    arrays = IndexArrays(
        shape,
        directory,
        words,
        offsets.word_starts,
        fields.hash_seed,
        fields.max_bucket,
        checks if verify else None,
        checks.all if verify else None,
    )

    def intact() -> str | None:
        if os.pread(handle.fileno(), len(header), 0) != header:
            return "its header or section table changed"
        return checks.problem()

    filt = IndexFilter(path, metadata, arrays, checks)
    filt.file_watch = FileWatch(path, handle, identity, intact)
    return filt


def _mapped(handle: Any, dtype: str, offset: int, count: int) -> np.ndarray:
    """``count`` items of ``dtype`` at ``offset`` of the open file, mapped copy-on-write (the
    file is never written through them)."""
    return np.memmap(handle, dtype=dtype, mode="c", offset=offset, shape=(count,))


def _write_small(
    path: str | os.PathLike[str],
    rows: np.ndarray,
    token_bits: int,
    shape_for: Callable[[int, float], IndexShape],
    rate: float,
    hash_seed: int,
    metadata: dict[str, Any],
) -> IndexFilter:
    """Write an index of the n-gram ``rows`` (token ids or word hashes) in one task, sized by
    ``shape_for(number of keys, concentration)``, and open it."""
    from memfree.filterfile.index.writer import IndexFileWriter

    prefixes = fingerprints_np(rows[:, :-1], hash_seed)
    keys = np.unique(index_keys(prefixes, rows[:, -1], token_bits))
    concentration = Concentration.of_keys(keys, token_bits)
    shape = shape_for(keys.size, concentration.value)
    encoded = encode_sections(keys, 0, shape.num_sections, shape)
    header = {
        **metadata,
        "n": int(rows.shape[1]),
        "hash_seed": hash_seed,
        "vocab_size": int(metadata["vocab_size"]),
        "target_false_positive_rate": rate,
    }
    writer = IndexFileWriter(path, header, shape, encoded.records, concentration)
    try:
        written = writer.target(0, shape.num_sections).write(encoded)
    except BaseException:
        writer.abort()
        raise
    return open_index(writer.commit([written], check=verify_written), verify=False)


def verify_written(temporary: Path) -> None:
    """Open a just-written index as every reader will, verified (a writer's last check).

    Raises:
        DamagedFilterError: the file fails its own check.
    """
    written = open_index(temporary, verify=True)
    try:
        written.verify()
    finally:
        written.close()


__all__ = ["DEFAULT_INDEX_FALSE_POSITIVE_RATE", "IndexFilter", "open_index", "verify_written"]
