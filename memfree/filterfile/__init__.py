"""The filter file: the bytes on disk and everything that reads or writes them.

What every layout shares, beside the layouts' folders:

- :mod:`~memfree.filterfile.hashing`, :mod:`~memfree.filterfile.sliding`: the one n-gram hash
  (numpy and torch, bit for bit) and every window of a sequence.
- :mod:`~memfree.filterfile.sizing`: blocked Bloom sizing and false-positive rates.
- :mod:`~memfree.filterfile.header`: the preamble both memfree layouts write and read, and
  :class:`FilterHeader`, every header parsed once; :mod:`~memfree.filterfile.filewatch`: an open
  file's identity.
- :mod:`~memfree.filterfile.protocol`: :class:`NgramSet`, what every format answers;
  :mod:`~memfree.filterfile.face`: :class:`NgramFilter`, the face every reader subclasses.

One folder per layout, each used through its ``__init__`` (its face; ``make lint`` holds it):
:mod:`~memfree.filterfile.index` (the prefix-keyed index, the default build),
:mod:`~memfree.filterfile.bloom` (the blocked Bloom layout) and
:mod:`~memfree.filterfile.pybloom` (pybloomfiltermmap3 0.6 interchange).

``NgramFilter.open`` of any filter file is an ``NgramFilter``; :func:`open_filter` opens a file
in whichever format its magic bytes name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memfree.filterfile import face
from memfree.filterfile.face import NgramFilter

if TYPE_CHECKING:
    from memfree.filterfile.protocol import NgramSet


def open_filter(
    ngram_filter: str | os.PathLike[str] | NgramSet, *, verify: bool = True, **kwargs: Any
) -> NgramSet:
    """Open and validate a filter file, in whichever format its magic bytes name; an already
    open filter is returned as it is.

    Args:
        ngram_filter: a memfree filter, or a pybloomfiltermmap3 file (with its ``.json`` sidecar,
            or ``ngram_size=`` given); or an open filter. A URL (``s3://bucket/web.memfree``,
            any fsspec protocol whose package is installed) is downloaded once into memfree's
            cache and opened from there (:func:`memfree.storage.fetched`).
        verify: check the bit array's checksum (reads the whole file once).
        **kwargs: passed to the pybloomfiltermmap3 reader (``ngram_size``).

    Returns:
        A :class:`~memfree.filterfile.bloom.reader.BloomFilter` (Bloom layout), an
        :class:`~memfree.filterfile.index.reader.IndexFilter` (prefix-keyed index), or a
        :class:`~memfree.filterfile.pybloom.reader.PybloomNgramFilter`.

    Raises:
        TypeError: neither a filter nor a path.
        FileNotFoundError: the path (or the object) does not exist.
        DamagedFilterError: the file is truncated, damaged, of another version or not a filter
            (a damaged download is dropped from the cache: the next open fetches it again).
        FilterError: a URL memfree does not take (credentials or a query in it).
        MissingDependencyError: the URL's protocol package is not installed.
    """
    # Imported here: importing one part of this package (the builder imports hashing) loads no
    # reader, and the interchange reader loads only for its own files.
    from memfree.filterfile.header import INDEX_FORMAT_VERSION, MAGIC, format_version, read_preamble
    from memfree.filterfile.protocol import NgramSet
    from memfree.storage import is_url

    if isinstance(ngram_filter, NgramSet):
        if kwargs:
            raise TypeError(f"unexpected arguments for an open filter: {sorted(kwargs)}")
        return ngram_filter
    if is_url(ngram_filter):  # a copy in memfree's cache, fetched again when the object changes
        return _open_url(str(ngram_filter), verify, **kwargs)
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
        from memfree.filterfile.index import open_index

        return open_index(path, verify)
    from memfree.filterfile.bloom import BloomFilter

    return BloomFilter._open_native(path, verify)


def _open_url(url: str, verify: bool, **kwargs: Any) -> NgramSet:
    """A filter given by URL, opened from its copy in memfree's cache."""
    from memfree.errors import DamagedFilterError, FilterError
    from memfree.storage import fetched, forget

    try:
        local = fetched(url)
    except ValueError as error:  # a URL memfree does not take
        raise FilterError(str(error)) from None
    try:
        return open_filter(local, verify=verify, **kwargs)
    except DamagedFilterError as error:
        forget(url)  # fetched again next time
        raise DamagedFilterError(
            f"{url}: the downloaded copy is not a usable filter ({error}); it was dropped from "
            "the cache: check the object (rebuild or upload it again)"
        ) from None


def _bloom() -> Any:
    from memfree.filterfile.bloom import BloomFilter

    return BloomFilter


face.OPENER[:] = [open_filter]
face.BLOOM[:] = [_bloom]


__all__ = ["NgramFilter", "open_filter"]
