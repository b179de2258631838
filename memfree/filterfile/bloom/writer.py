"""Writing memfree's filter file (layout in :mod:`memfree.filterfile.bloom.reader`): the blocked bit arrays, the
header that records what produced them, and one atomic, deterministic write of both.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from memfree.fileio import PendingFile
from memfree.filterfile.bloom.bits import hashing_digest
from memfree.filterfile.bloom.fields import LAYOUT, check_metadata
from memfree.filterfile.hashing import (
    BLOCK_BITS,
    DEFAULT_HASH_SEED,
    HASH_SCHEME,
    PROBE_MULTIPLIERS,
    WORDS_PER_BLOCK,
    fingerprints_np,
    probe_positions_np,
)
from memfree.filterfile.header import (
    FORMAT_VERSION,
    PREAMBLE,
    header_bytes,
    json_bytes,
    page_round,
)
from memfree.filterfile.sizing import choose_size, expected_false_positive_rate

# The prefix section only decides when the guard may skip a row, so a looser rate than the
# n-gram array's keeps it small (about 10 bits per prefix) while still skipping 99% of the
# steps whose prefix begins no stored n-gram.
DEFAULT_PREFIX_FALSE_POSITIVE_RATE = 0.01


@dataclass(frozen=True)
class PrefixSection:
    """Shape of a filter file's prefix section (see :mod:`memfree.filterfile.bloom.reader`)."""

    num_blocks: int
    num_probes: int
    num_prefixes: int


class FilterFileWriter:
    """Writes a filter file in place: the bit words are a writable memory map of a temporary file,
    so a filter larger than memory can be filled; :meth:`commit` checksums, writes the header and
    renames the file into place. Used as a context manager, an exception discards the temporary.

    Args:
        path: final output path.
        num_blocks: 512-bit blocks of the bit array.
        metadata: must hold ``n``, ``num_probes``, ``hash_seed`` and ``num_ngrams``.
        prefix: shape of the optional prefix section (then :attr:`prefix_bit_words` is writable).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        num_blocks: int,
        metadata: Mapping[str, Any],
        prefix: PrefixSection | None = None,
    ) -> None:
        self.path = Path(path)
        self.metadata = dict(metadata)
        self.metadata.update(
            format_version=FORMAT_VERSION,
            layout=LAYOUT,
            hash_scheme=HASH_SCHEME,
            num_bits=num_blocks * BLOCK_BITS,
            num_blocks=num_blocks,
            bits_xxh3="0" * 16,
            hashing_xxh3="0" * 16,
        )
        self.metadata["expected_false_positive_rate"] = expected_false_positive_rate(
            int(self.metadata["num_ngrams"]), num_blocks, int(self.metadata["num_probes"])
        )
        self.metadata.pop("prefix", None)
        if prefix is not None:
            self.metadata["prefix"] = {
                "num_bits": prefix.num_blocks * BLOCK_BITS,
                "num_probes": prefix.num_probes,
                "num_prefixes": prefix.num_prefixes,
                "expected_false_positive_rate": expected_false_positive_rate(
                    prefix.num_prefixes, prefix.num_blocks, prefix.num_probes
                ),
                "bits_xxh3": "0" * 16,
            }
        problem = check_metadata(self.metadata)
        if problem:
            raise ValueError(f"cannot write {self.path}: {problem}")
        self._data_offset = page_round(PREAMBLE.size + len(self._metadata_bytes()))
        self._pending = PendingFile(self.path)
        num_words = num_blocks * WORDS_PER_BLOCK
        prefix_bit_words = prefix.num_blocks * WORDS_PER_BLOCK if prefix else 0
        try:
            with open(self._pending.temporary, "r+b") as out:
                out.truncate(self._data_offset + (num_words + prefix_bit_words) * 8)
            self.bit_words = np.memmap(
                self._pending.temporary,
                dtype="<u8",
                mode="r+",
                offset=self._data_offset,
                shape=(num_words,),
            )
            self.prefix_bit_words: np.memmap[Any, Any] | None = None
            if prefix is not None:
                self.prefix_bit_words = np.memmap(
                    self._pending.temporary,
                    dtype="<u8",
                    mode="r+",
                    offset=self._data_offset + num_words * 8,
                    shape=(prefix_bit_words,),
                )
        except BaseException:  # e.g. no room for the file: leave no temporary behind
            self.abort()
            raise

    def _metadata_bytes(self) -> bytes:
        return json_bytes(self.metadata)

    def commit(self, check: Callable[[Path], None] | None = None) -> Path:
        """Checksum the bits, write the header, then fsync and rename into place.

        Args:
            check: called with the complete temporary file before the rename (e.g. to open it
                as a reader would); an exception from it discards the file, and the target is
                left as it was.
        """
        try:
            self.bit_words.flush()
            self.metadata["bits_xxh3"] = xxhash.xxh3_64_hexdigest(self.bit_words.data.cast("B"))
            if self.prefix_bit_words is not None:
                self.prefix_bit_words.flush()
                self.metadata["prefix"]["bits_xxh3"] = xxhash.xxh3_64_hexdigest(
                    self.prefix_bit_words.data.cast("B")
                )
            self.metadata["hashing_xxh3"] = hashing_digest(self.metadata)
            header = header_bytes(self.metadata, FORMAT_VERSION, self._data_offset)
            del self.bit_words
            self.prefix_bit_words = None
            with open(self._pending.temporary, "r+b") as out:
                out.write(header)
            if check is not None:
                check(self._pending.temporary)
        except BaseException:
            self.abort()
            raise
        self._pending.commit()
        return self.path

    def abort(self) -> None:
        """Discard the temporary file."""
        self.__dict__.pop("bit_words", None)
        self.prefix_bit_words = None
        self._pending.discard()

    def __enter__(self) -> FilterFileWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def write_filter(
    path: str | os.PathLike[str],
    bit_words: np.ndarray,
    metadata: Mapping[str, Any],
    prefix_bit_words: np.ndarray | None = None,
    prefix_num_probes: int = 0,
    num_prefixes: int = 0,
) -> Path:
    """Write bit_words (and an optional prefix section) as a filter file, atomically."""
    arrays = [np.ascontiguousarray(bit_words, dtype="<u8")]
    if prefix_bit_words is not None:
        arrays.append(np.ascontiguousarray(prefix_bit_words, dtype="<u8"))
    for array in arrays:
        if array.ndim != 1 or array.shape[0] == 0 or array.shape[0] % WORDS_PER_BLOCK:
            raise ValueError(
                f"bit words must be a 1-D array of whole 512-bit blocks, got {array.shape}"
            )
    prefix = None
    if prefix_bit_words is not None:
        prefix = PrefixSection(
            arrays[1].shape[0] // WORDS_PER_BLOCK, prefix_num_probes, num_prefixes
        )
    with FilterFileWriter(path, arrays[0].shape[0] // WORDS_PER_BLOCK, metadata, prefix) as writer:
        writer.bit_words[:] = arrays[0]
        if writer.prefix_bit_words is not None:
            writer.prefix_bit_words[:] = arrays[1]
    return writer.path


def write_ngrams(
    path: str | os.PathLike[str],
    ngrams: np.ndarray | list[list[int]],
    *,
    false_positive_rate: float = 1e-3,
    prefix_false_positive_rate: float | None = DEFAULT_PREFIX_FALSE_POSITIVE_RATE,
    hash_seed: int = DEFAULT_HASH_SEED,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write a filter file holding exactly the given n-grams (deduplicated), atomically.

    The body of :meth:`memfree.filterfile.bloom.reader.NgramFilter.from_ngrams`, which documents the arguments.

    Args:
        path: output path.
        ngrams: integer array `(N, n)` of token ids; N may be 0.
        false_positive_rate: target rate of the n-gram bit array.
        prefix_false_positive_rate: target rate of the prefix section, or None for none.
        hash_seed: hash seed.
        metadata: extra header fields (e.g. ``tokenizer_fingerprint``, ``tokenizer``).

    Returns:
        The path written.
    """
    array = np.asarray(ngrams)
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"ngrams must be a 2-D (N, n) array with n >= 1, got {array.shape}")
    if array.size and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0):
        raise ValueError("ngrams must hold non-negative integer token ids")
    array = np.unique(array.astype(np.int64), axis=0)
    fingerprints = fingerprints_np(array, hash_seed)
    size = choose_size(array.shape[0], false_positive_rate)
    bit_words = bits_from_fingerprints(fingerprints, size.num_blocks, size.num_probes)
    header = {"unit": "token", "n": int(array.shape[1]), "min_count": 1, **(metadata or {})}
    header.update(
        n=int(array.shape[1]),
        hash_seed=hash_seed,
        num_probes=size.num_probes,
        num_ngrams=int(array.shape[0]),
        target_false_positive_rate=false_positive_rate,
    )
    prefix_bit_words, prefix_probes, num_prefixes = None, 0, 0
    if prefix_false_positive_rate is not None and array.shape[1] > 1:
        prefixes = np.unique(array[:, :-1], axis=0)
        num_prefixes = int(prefixes.shape[0])
        prefix_size = choose_size(num_prefixes, prefix_false_positive_rate)
        prefix_probes = prefix_size.num_probes
        prefix_bit_words = bits_from_fingerprints(
            fingerprints_np(prefixes, hash_seed), prefix_size.num_blocks, prefix_probes
        )
    return write_filter(path, bit_words, header, prefix_bit_words, prefix_probes, num_prefixes)


def bits_from_fingerprints(
    fingerprints: np.ndarray, num_blocks: int, num_probes: int
) -> np.ndarray:
    """A blocked bit array holding the given fingerprints (uint64 `(num_blocks * 8,)`)."""
    bit_words = np.zeros(num_blocks * WORDS_PER_BLOCK, dtype=np.uint64)
    set_fingerprint_bits(bit_words, fingerprints, num_probes)
    return bit_words


def set_fingerprint_bits(
    bit_words: np.ndarray, fingerprints: np.ndarray, num_probes: int, chunk: int = 1 << 20
) -> None:
    """OR the probe bits of ``fingerprints`` into ``bit_words`` in place, in bounded-memory chunks.

    Each chunk is sorted first: a fingerprint's block grows with its value, so a sorted chunk's
    probes fall in a narrow run of blocks, set as one bool per bit and packed into bit_words (about
    4x faster than ``np.bitwise_or.at``). A chunk whose blocks lie too far apart for that (an
    unsorted input much larger than a chunk) takes ``np.bitwise_or.at``. The builder passes
    sorted fingerprints.
    """
    num_blocks = bit_words.shape[0] // WORDS_PER_BLOCK
    fingerprints = np.asarray(fingerprints, dtype=np.uint64)
    shift = np.uint64(64 - 9)  # a probe's offset: the top 9 bits of fingerprint * multiplier
    for begin in range(0, fingerprints.shape[0], chunk):
        part = np.asarray(fingerprints[begin : begin + chunk])
        if part.shape[0] > 1 and not (part[1:] >= part[:-1]).all():
            part = np.sort(part)
        blocks = ((part >> np.uint64(32)) * np.uint64(num_blocks)) >> np.uint64(32)
        first, last = int(blocks[0]), int(blocks[-1])
        # One byte of scratch per bit of the blocks touched: at most what the positions take.
        if (last - first + 1) * BLOCK_BITS > max(16 << 20, 8 * part.shape[0] * num_probes):
            _or_bits_scattered(bit_words, part, num_blocks, num_probes)
            continue
        base = (blocks - np.uint64(first)) * np.uint64(BLOCK_BITS)
        scratch = np.zeros((last - first + 1) * BLOCK_BITS, dtype=bool)
        position = np.empty_like(part)
        for multiplier in PROBE_MULTIPLIERS[:num_probes]:
            np.multiply(part, np.uint64(multiplier), out=position)
            position >>= shift
            position += base
            scratch[position.view(np.int64)] = True  # < 2**55: the same value; intp indexes fastest
        packed = np.packbits(scratch, bitorder="little").view("<u8")
        bit_words[first * WORDS_PER_BLOCK : (last + 1) * WORDS_PER_BLOCK] |= packed


def _or_bits_scattered(
    bit_words: np.ndarray, fingerprints: np.ndarray, num_blocks: int, num_probes: int
) -> None:
    """OR the probe bits of fingerprints spread over the whole array into ``bit_words``."""
    positions = probe_positions_np(fingerprints, num_blocks, num_probes).ravel()
    np.bitwise_or.at(
        bit_words, positions >> 6, np.left_shift(np.uint64(1), (positions & 63).astype(np.uint64))
    )
