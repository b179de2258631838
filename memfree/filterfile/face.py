"""The face every filter layout's reader has: :class:`NgramFilter`.

The readers (:mod:`~memfree.filterfile.index`, :mod:`~memfree.filterfile.bloom`,
:mod:`~memfree.filterfile.pybloom`) subclass it; :meth:`NgramFilter.open` opens a file in
whichever format its magic bytes name, through the opener the package installs
(:func:`memfree.filterfile.open_filter`), so this module imports no reader and no reader imports
the package above it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from memfree.filterfile.filewatch import FileWatch
    from memfree.filterfile.header import FilterHeader

#: The package's :func:`~memfree.filterfile.open_filter`, installed when the package loads
#: (before any of its modules can be imported).
OPENER: list[Callable[..., Any]] = []
#: The Bloom layout's reader class, found by a function the package installs alike (what
#: :meth:`NgramFilter.from_ngrams` and :meth:`NgramFilter.create` write with).
BLOOM: list[Callable[[], Any]] = []


class NgramFilter:
    """A read-only, memory-mapped set of n-grams: the face of every layout's reader.

    :meth:`open` reads any filter file, in whichever format its magic bytes name, and returns
    that layout's reader: a :class:`~memfree.filterfile.index.IndexFilter` (the prefix-keyed
    index, the default build), a :class:`~memfree.filterfile.bloom.BloomFilter` (the blocked
    Bloom layout) or a :class:`~memfree.filterfile.pybloom.PybloomNgramFilter`
    (pybloomfiltermmap3 interchange); each is an ``NgramFilter`` and answers what
    :class:`~memfree.filterfile.protocol.NgramSet` names. Queries never produce false negatives.

    Example:
        >>> filt = NgramFilter.open("stdlib.memfree")  # doctest: +SKIP
        >>> filt.contains([[1, 2, 3], [4, 5, 6]])  # doctest: +SKIP
        array([ True, False])
    """

    path: Path
    n: int
    num_ngrams: int
    header: FilterHeader  # the header, parsed once at open and read by attribute
    file_watch: FileWatch | None  # the open file's identity, which guards check around reads

    # What follows from the header (parsed once at open) is answered here for every layout.

    @property
    def unit(self) -> str:
        """``"token"`` (n-grams of token ids) or ``"word"`` (n-grams of normalized words)."""
        return self.header.unit

    @property
    def layout(self) -> str:
        """The file's layout, as its header names it."""
        return self.header.layout

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of the file's header as JSON (what ``memfree info`` shows)."""
        copied: dict[str, Any] = json.loads(json.dumps(dict(self.header.raw)))
        return copied

    @property
    def special_token_ids(self) -> tuple[int, ...] | None:
        """The ids the builder cut at (never in a stored n-gram), when the file records them."""
        return self.header.special_token_ids

    @property
    def size_bytes(self) -> int:
        """The file's size."""
        return self.path.stat().st_size

    @property
    def expected_false_positive_rate(self) -> float:
        """The rate at which an n-gram that is not stored is said to be."""
        return self.header.expected_false_positive_rate

    def __len__(self) -> int:
        return self.num_ngrams

    def query_rows(self, ngrams: np.ndarray | list[list[int]]) -> tuple[np.ndarray, bool]:
        """The n-grams a query gives as rows `(N, n)`, and whether it gave one n-gram `(n,)`.

        Raises:
            ValueError: rows of another length than this filter's n.
        """
        array = np.asarray(ngrams)
        single = array.ndim == 1
        if single:
            array = array[None, :]
        if array.ndim != 2 or array.shape[1] != self.n:
            raise ValueError(
                f"ngrams must have shape (N, {self.n}) for this {self.n}-gram filter, "
                f"got {np.asarray(ngrams).shape}"
            )
        return array, single

    # What each layout's reader answers itself.

    def contains(self, ngrams: np.ndarray | list[list[int]]) -> np.ndarray:
        """Whether each n-gram (rows of ``(N, n)`` ids) is stored; never a false negative."""
        raise NotImplementedError

    def blocked_bits(self) -> Any:
        """The bit arrays of memfree's blocked Bloom layout, a
        :class:`~memfree.filterfile.protocol.BlockedBits` (None in another layout)."""
        raise NotImplementedError

    def prefix_index(self) -> Any:
        """The prefix-keyed index's arrays, an :class:`~memfree.filterfile.index.IndexArrays`
        (None in another layout; typed there and in :class:`~memfree.filterfile.protocol.NgramSet`:
        this module imports neither a layout nor the protocol, which names them)."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop the mapping (queries after this fail)."""
        raise NotImplementedError

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, verify: bool = True, **kwargs: Any
    ) -> NgramFilter:
        """Open and validate a filter file, in whichever format its magic bytes name.

        Args:
            path: a memfree filter (either layout), or a pybloomfiltermmap3 file (with its
                ``.json`` sidecar, or ``ngram_size=`` given).
            verify: check the file's checksums (reads the whole file once).
            **kwargs: passed to the pybloomfiltermmap3 reader (``ngram_size``).

        Returns:
            The layout's reader (an :class:`NgramFilter`).

        Raises:
            FileNotFoundError: the path does not exist.
            DamagedFilterError: the file is truncated, damaged, of another version or not a filter.
        """
        return OPENER[0](path, verify=verify, **kwargs)

    @classmethod
    def from_ngrams(
        cls, path: str | os.PathLike[str], ngrams: np.ndarray | list[list[int]], **kwargs: Any
    ) -> NgramFilter:
        """Write a Bloom filter (the blocked layout) of exactly ``ngrams`` and open it: for small,
        explicit sets (tests, hand-made block lists); :meth:`IndexFilter.from_ngrams
        <memfree.filterfile.index.IndexFilter.from_ngrams>` writes the prefix index, and
        corpora go through ``memfree build``. The arguments are
        :meth:`BloomFilter.from_ngrams <memfree.filterfile.bloom.BloomFilter.from_ngrams>`'s."""
        return BLOOM[0]().from_ngrams(path, ngrams, **kwargs)

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], bit_words: np.ndarray, metadata: Any
    ) -> NgramFilter:
        """Write a Bloom filter file from its bit array (:meth:`BloomFilter.create
        <memfree.filterfile.bloom.BloomFilter.create>`) and open it."""
        return BLOOM[0]().create(path, bit_words, metadata)


__all__ = ["NgramFilter"]
