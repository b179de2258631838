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

:func:`open_filter` opens a file in whichever format its magic bytes name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memfree.filterfile.protocol import NgramSet


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
        A :class:`~memfree.filterfile.native.NgramFilter` (Bloom layout), an
        :class:`~memfree.filterfile.index_file.IndexFilter` (prefix-keyed index), or a
        :class:`~memfree.filterfile.pybloom.PybloomNgramFilter`.

    Raises:
        TypeError: neither a filter nor a path.
        FileNotFoundError: the path does not exist.
        DamagedFilterError: the file is truncated, damaged, of another version or not a filter.
    """
    # Imported here: importing one part of this package (the builder imports hashing) loads no
    # reader, and the interchange reader loads only for its own files.
    from memfree.filterfile.header import INDEX_FORMAT_VERSION, MAGIC, format_version, read_preamble
    from memfree.filterfile.protocol import NgramSet

    if isinstance(ngram_filter, NgramSet):
        if kwargs:
            raise TypeError(f"unexpected arguments for an open filter: {sorted(kwargs)}")
        return ngram_filter
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
    from memfree.filterfile.native import NgramFilter

    return NgramFilter._open_native(path, verify)


__all__ = ["open_filter"]
