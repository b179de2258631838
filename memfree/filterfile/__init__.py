"""The filter file: the bytes on disk and everything that reads or writes them.

- :mod:`~memfree.filterfile.hashing`, :mod:`~memfree.filterfile.sliding`: the one n-gram hash
  (numpy and torch, bit for bit) and every window of a sequence.
- :mod:`~memfree.filterfile.sizing`: blocked Bloom sizing and false-positive rates.
- :mod:`~memfree.filterfile.header` (with ``header_fields``, ``header_bits``): the layout and its
  validation; :mod:`~memfree.filterfile.filewatch`: an open file's identity.
- :mod:`~memfree.filterfile.native` / ``native_open`` / ``writer``: memfree's own format.
- :mod:`~memfree.filterfile.index_layout` / ``index_header`` / ``index_file``: the prefix-keyed
  index (one lookup per row).
- :mod:`~memfree.filterfile.pybloom` (with ``pybloom_format``, ``pybloom_hash``,
  ``pybloom_writer``): pybloomfiltermmap3 0.6 interchange.
- :mod:`~memfree.filterfile.protocol`: :class:`NgramSet`, what every format answers.

:class:`NgramFilter` is the face every layout's reader has (``NgramFilter.open`` of any filter
file is an ``NgramFilter``); :func:`open_filter` opens a file in whichever format its magic bytes
name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from memfree.filterfile.filewatch import FileWatch
    from memfree.filterfile.index_read import IndexArrays
    from memfree.filterfile.protocol import BlockedBits, NgramSet


class NgramFilter:
    """A read-only, memory-mapped set of n-grams: the face of every layout's reader.

    :meth:`open` reads any filter file, in whichever format its magic bytes name, and returns
    that layout's reader: a :class:`~memfree.filterfile.index_file.IndexFilter` (the prefix-keyed
    index, the default build), a :class:`~memfree.filterfile.native.BloomFilter` (the blocked
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
    file_watch: FileWatch | None  # the open file's identity, which guards check around reads

    # What every layout answers (NgramSet); each reader defines them.

    @property
    def unit(self) -> str:
        """``"token"`` or ``"word"``: what the stored n-grams are made of."""
        raise NotImplementedError

    @property
    def layout(self) -> str:
        """The file's layout, as its header names it."""
        raise NotImplementedError

    @property
    def metadata(self) -> dict[str, Any]:
        """The file's header as a dict (what ``memfree info`` shows)."""
        raise NotImplementedError

    @property
    def special_token_ids(self) -> tuple[int, ...] | None:
        """The ids the builder cut at (never in a stored n-gram), when the file records them."""
        raise NotImplementedError

    @property
    def size_bytes(self) -> int:
        """The file's size."""
        raise NotImplementedError

    @property
    def expected_false_positive_rate(self) -> float:
        """The rate at which an n-gram that is not stored is said to be."""
        raise NotImplementedError

    def contains(self, ngrams: np.ndarray | list[list[int]]) -> np.ndarray:
        """Whether each n-gram (rows of ``(N, n)`` ids) is stored; never a false negative."""
        raise NotImplementedError

    def blocked_bits(self) -> BlockedBits | None:
        """The bit arrays of memfree's blocked Bloom layout (None in another layout)."""
        raise NotImplementedError

    def prefix_index(self) -> IndexArrays | None:
        """The prefix-keyed index's arrays (None in another layout)."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Drop the mapping (queries after this fail)."""
        raise NotImplementedError

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: bool = True, **kwargs: Any) -> NgramSet:
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
        return open_filter(path, verify=verify, **kwargs)

    @classmethod
    def from_ngrams(
        cls, path: str | os.PathLike[str], ngrams: np.ndarray | list[list[int]], **kwargs: Any
    ) -> NgramFilter:
        """Write a Bloom filter (the blocked layout) of exactly ``ngrams`` and open it: for small,
        explicit sets (tests, hand-made block lists); :meth:`IndexFilter.from_ngrams
        <memfree.filterfile.index_file.IndexFilter.from_ngrams>` writes the prefix index, and
        corpora go through ``memfree build``. The arguments are
        :meth:`BloomFilter.from_ngrams <memfree.filterfile.native.BloomFilter.from_ngrams>`'s."""
        from memfree.filterfile.native import BloomFilter

        return BloomFilter.from_ngrams(path, ngrams, **kwargs)

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], bit_words: np.ndarray, metadata: Any
    ) -> NgramFilter:
        """Write a Bloom filter file from its bit array (:meth:`BloomFilter.create
        <memfree.filterfile.native.BloomFilter.create>`) and open it."""
        from memfree.filterfile.native import BloomFilter

        return BloomFilter.create(path, bit_words, metadata)


def open_filter(
    ngram_filter: str | os.PathLike[str] | NgramSet, *, verify: bool = True, **kwargs: Any
) -> NgramSet:
    """Open and validate a filter file, in whichever format its magic bytes name; an already
    open filter is returned as it is.

    Args:
        ngram_filter: a memfree filter, or a pybloomfiltermmap3 file (with its ``.json`` sidecar,
            or ``ngram_size=`` given); or an open filter.
        verify: check the bit array's checksum (reads the whole file once).
        **kwargs: passed to the pybloomfiltermmap3 reader (``ngram_size``).

    Returns:
        A :class:`~memfree.filterfile.native.BloomFilter` (Bloom layout), an
        :class:`~memfree.filterfile.index_file.IndexFilter` (prefix-keyed index), or a
        :class:`~memfree.filterfile.pybloom.PybloomNgramFilter`.

    Raises:
        TypeError: neither a filter nor a path.
        FileNotFoundError: the path does not exist.
        DamagedFilterError: the file is truncated, damaged, of another version or not a filter.
    """
    # Imported here: importing one part of this package (the builder imports hashing) loads no
    # reader, and the interchange reader loads only for its own files.
    from memfree.errors import FilterError, url_problem
    from memfree.filterfile.header import INDEX_FORMAT_VERSION, MAGIC, format_version, read_preamble
    from memfree.filterfile.protocol import NgramSet

    if isinstance(ngram_filter, NgramSet):
        if kwargs:
            raise TypeError(f"unexpected arguments for an open filter: {sorted(kwargs)}")
        return ngram_filter
    problem = url_problem(ngram_filter, "the filter")
    if problem is not None:
        raise FilterError(problem)
    if not isinstance(ngram_filter, (str, os.PathLike)):
        raise TypeError(
            "ngram_filter must be an NgramFilter or the path of a filter file, got "
            f"{type(ngram_filter).__name__}"
        )
    path = Path(ngram_filter)
    head = read_preamble(path)
    if not head.startswith(MAGIC):  # the interchange reader loads only for other files
        from memfree.filterfile import pybloom

        if head.startswith(pybloom.MAGIC):
            return pybloom.open_pybloom(path, verify=verify, **kwargs)
    if kwargs:
        raise TypeError(f"unexpected arguments for a memfree filter: {sorted(kwargs)}")
    if format_version(head) == INDEX_FORMAT_VERSION:
        from memfree.filterfile.index_file import open_index

        return open_index(path, verify)
    from memfree.filterfile.native import BloomFilter

    return BloomFilter._open_native(path, verify)


__all__ = ["NgramFilter", "open_filter"]


__all__ = ["open_filter"]
