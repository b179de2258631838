"""Reading memfree's own filter file: a validated, memory-mapped, cache-line-blocked Bloom filter.
The read Protocol every format implements is in :mod:`memfree.filterfile.protocol`; the byte layout
in :mod:`memfree.filterfile.header`; opening a file in :mod:`memfree.filterfile.bloom.opening`;
writing in :mod:`memfree.filterfile.bloom.writer`; dispatching on a file's magic bytes in
:func:`memfree.filterfile.open_filter`.

With a prefix section, an n-gram is a member when its prefix *and* the n-gram are both found.
That is still free of false negatives (every stored n-gram's prefix is in the prefix section) and
lets the guard skip, exactly, every decoding step whose last n-1 tokens begin no stored n-gram.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memfree.filterfile.bloom.header import BloomHeader
from memfree.filterfile.bloom.opening import open_native
from memfree.filterfile.bloom.writer import (
    DEFAULT_PREFIX_FALSE_POSITIVE_RATE,
    write_filter,
    write_ngrams,
)
from memfree.filterfile.face import NgramFilter
from memfree.filterfile.filewatch import FileWatch
from memfree.filterfile.hashing import DEFAULT_HASH_SEED, fingerprints_np, query_bits_np
from memfree.filterfile.protocol import BlockedBits, NgramSet


class BloomFilter(NgramFilter):
    """A read-only set of n-grams in memfree's blocked Bloom layout, backed by one memory-mapped
    file (the default layout of earlier releases, still built with ``--layout blocked-512``).

    Open with :meth:`NgramFilter.open <memfree.filterfile.NgramFilter.open>` (validates magic,
    version, size, parameters and checksum) or write one with :meth:`create` or
    :meth:`from_ngrams`. Queries never produce false negatives.
    """

    def __init__(
        self,
        path: Path,
        bit_words: np.ndarray,
        metadata: dict[str, Any],
        prefix_bit_words: np.ndarray | None = None,
    ) -> None:
        self.path = path
        self._bit_words = bit_words
        self._prefix_bit_words = prefix_bit_words
        self.header = header = BloomHeader.read(metadata)
        self.prefix_num_probes: int = header.prefix_num_probes
        self.n: int = header.n
        self.num_bits: int = header.num_bits
        self.num_probes: int = header.num_probes
        self.hash_seed: int = header.hash_seed
        self.num_ngrams: int = header.num_ngrams
        # The open file's identity, which guards check around their reads (None: not mapped).
        self.file_watch: FileWatch | None = None

    # -- opening and creating ----------------------------------------------------------------

    @classmethod
    def _open_native(cls, path: Path, verify: bool) -> BloomFilter:
        opened = open_native(path, verify)
        filt = cls(path, opened.bit_words, opened.metadata, opened.prefix_bit_words)
        filt.file_watch = opened.file_watch
        return filt

    @classmethod
    def _open_written(cls, path: str | os.PathLike[str]) -> BloomFilter:
        """Open (verified) a native file this process just wrote."""
        return cls._open_native(Path(path), verify=True)

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        bit_words: np.ndarray,
        metadata: Mapping[str, Any],
    ) -> BloomFilter:
        """Write a filter file atomically (temporary name, then rename) and open it.

        Args:
            path: output path; never left half-written.
            bit_words: uint64 array `(num_blocks * 8,)` of bit words.
            metadata: must hold ``n``, ``num_probes``, ``hash_seed`` and ``num_ngrams``; layout,
                sizes, expected false-positive rate and checksum are filled in here.
        """
        return cls._open_written(write_filter(path, bit_words, metadata))

    @classmethod
    def from_ngrams(  # type: ignore[override]  # each layout takes its own arguments
        cls,
        path: str | os.PathLike[str],
        ngrams: np.ndarray | list[list[int]],
        *,
        false_positive_rate: float = 1e-3,
        prefix_false_positive_rate: float | None = DEFAULT_PREFIX_FALSE_POSITIVE_RATE,
        hash_seed: int = DEFAULT_HASH_SEED,
        metadata: Mapping[str, Any] | None = None,
    ) -> BloomFilter:
        """Write a filter holding exactly the given n-grams (deduplicated) and open it.

        For small, explicit sets (tests, hand-made block lists); corpora go through
        ``memfree build``.

        Args:
            path: output path (written atomically).
            ngrams: integer array `(N, n)` of token ids; N may be 0.
            false_positive_rate: target rate of the n-gram bit array.
            prefix_false_positive_rate: target rate of the prefix section, or None for none.
            hash_seed: hash seed.
            metadata: extra header fields (e.g. ``tokenizer_fingerprint``, ``tokenizer``).
        """
        written = write_ngrams(
            path,
            ngrams,
            false_positive_rate=false_positive_rate,
            prefix_false_positive_rate=prefix_false_positive_rate,
            hash_seed=hash_seed,
            metadata=metadata,
        )
        return cls._open_written(written)

    # -- queries --------------------------------------------------------------------------------

    def contains(self, ngrams: np.ndarray | list[list[int]]) -> np.ndarray:
        """Whether each n-gram is (probably) stored; never a false negative.

        Args:
            ngrams: integer array `(N, n)` of token ids (or `(n,)` for one n-gram).

        Returns:
            bool array `(N,)` (or a 0-d bool array for one n-gram).
        """
        array, single = self.query_rows(ngrams)
        if array.size and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0):
            raise ValueError("ngrams must hold non-negative integer token ids")
        result = self.contains_fingerprints(fingerprints_np(array, self.hash_seed))
        if self._prefix_bit_words is not None and self.n > 1:
            result &= self.contains_prefixes(array[:, :-1])
        return result[0] if single else result

    def contains_prefixes(self, prefixes: np.ndarray | list[list[int]]) -> np.ndarray:
        """Whether each (n-1)-token prefix may begin a stored n-gram; never a false negative.

        A filter without a prefix section (or with n = 1) answers True for every prefix.

        Args:
            prefixes: integer array `(N, n - 1)` of token ids.

        Returns:
            bool array `(N,)`.
        """
        array = np.asarray(prefixes)
        if array.ndim != 2 or array.shape[1] != self.n - 1:
            raise ValueError(
                f"prefixes must have shape (N, {self.n - 1}) for this {self.n}-gram filter, "
                f"got {array.shape}"
            )
        if array.size and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0):
            raise ValueError("prefixes must hold non-negative integer token ids")
        if self._prefix_bit_words is None or self.n == 1:
            return np.ones(array.shape[0], dtype=bool)
        return query_bits_np(
            self._prefix_bit_words, fingerprints_np(array, self.hash_seed), self.prefix_num_probes
        )

    def contains_fingerprints(self, fingerprints: np.ndarray) -> np.ndarray:
        """Membership of precomputed n-gram fingerprints in the n-gram bit array alone.

        Args:
            fingerprints: uint64 `(N,)` from :func:`memfree.filterfile.hashing.fingerprints_np`.

        Returns:
            bool `(N,)`. The prefix section is not consulted, so this is a superset of
            :meth:`contains` (still no false negatives).
        """
        return query_bits_np(
            self._bit_words, np.asarray(fingerprints, dtype=np.uint64), self.num_probes
        )

    # -- properties -----------------------------------------------------------------------------

    @property
    def bit_words(self) -> np.ndarray:
        """The bit array as little-endian uint64 words (memory-mapped, do not write)."""
        return self._bit_words

    @property
    def prefix_bit_words(self) -> np.ndarray | None:
        """The prefix section's uint64 words, or None when the file has none."""
        return self._prefix_bit_words

    def blocked_bits(self) -> BlockedBits:
        """The bit arrays and probe counts, for the guard core (see :class:`BlockedBits`)."""
        return BlockedBits(
            self._bit_words,
            self.num_probes,
            self.hash_seed,
            self._prefix_bit_words,
            self.prefix_num_probes,
        )

    def prefix_index(self) -> None:
        """None: this layout is not the prefix-keyed index."""
        return None

    @property
    def has_prefix_section(self) -> bool:
        return self._prefix_bit_words is not None

    def __repr__(self) -> str:
        return (
            f"BloomFilter({str(self.path)!r}, n={self.n}, num_ngrams={self.num_ngrams}, "
            f"num_bits={self.num_bits}, num_probes={self.num_probes}, "
            f"expected_fpr={self.expected_false_positive_rate:.3g})"
        )

    def close(self) -> None:
        """Drop the mapping (queries after this fail)."""
        still_mapped = False
        for array in (self._bit_words, self._prefix_bit_words):
            mapping = getattr(array, "_mmap", None)
            if mapping is not None:
                # Another view (e.g. a torch tensor) may still use it; it then closes with it.
                try:
                    mapping.close()
                except BufferError:
                    still_mapped = True
        if self.file_watch is not None and not still_mapped:
            self.file_watch.close()  # a guard still reading the pages keeps checking them
        self._bit_words = np.empty(0, dtype=np.uint64)
        if self._prefix_bit_words is not None:
            self._prefix_bit_words = np.empty(0, dtype=np.uint64)

    def __enter__(self) -> BloomFilter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def describe_rate(rate: float) -> str:
    """A false-positive rate as "1 in N" text."""
    if rate <= 0:
        return "0"
    return f"{rate:.3g} (1 in {math.ceil(1 / rate):,})"


__all__ = ["BlockedBits", "BloomFilter", "NgramFilter", "NgramSet", "describe_rate"]
