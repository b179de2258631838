"""Interchange with pybloomfiltermmap3 0.6 files: a strict reader, which answers the same read
Protocol as memfree's own filter. The layout and sidecar are in :mod:`memfree.filterfile.pybloom.layout`, the
deterministic writer in :mod:`memfree.filterfile.pybloom.writer`, the library's hashing, replicated in numpy,
in :mod:`memfree.filterfile.pybloom.arithmetic`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from memfree.errors import DamagedFilterError, FilterError, FilterMismatchError
from memfree.filterfile.face import NgramFilter
from memfree.filterfile.filewatch import FileIdentity, FileWatch
from memfree.filterfile.header import MAX_NGRAM_SIZE
from memfree.filterfile.pybloom.arithmetic import (  # expected_false_positive_rate: re-exported for the builder
    estimate_num_ngrams,
    expected_false_positive_rate,
    ngram_key_bytes,
    probe_positions,
)
from memfree.filterfile.pybloom.layout import (
    BF_VERSION,
    HASH_SCHEME,
    HEADER_BYTES,
    KEY_ENCODING,
    LAYOUT,
    MAGIC,
    PREAMBLE_BYTES,
    PybloomHeader,
    parse_header,
    read_sidecar,
    sidecar_path,
    xxh3_hex,
)
from memfree.filterfile.pybloom.writer import PybloomWriter


class PybloomNgramFilter(NgramFilter):
    """A read-only n-gram set in a pybloomfiltermmap3 file; open it with :func:`open_pybloom`.

    Implements :class:`memfree.filterfile.bloom.reader.NgramSet` (the read API every filter format shares) without
    subclassing :class:`~memfree.filterfile.bloom.reader.NgramFilter`: its n-grams are not in memfree's blocked
    layout, so :meth:`blocked_bits` is None and the guard asks :meth:`contains`. ``bits`` is the
    memory-mapped bit array (uint8; bit b is ``bits[b >> 3] >> (b & 7) & 1``), ``seeds`` the
    library's hash seeds.

    Example:
        >>> filt = open_pybloom("ngrams.bloom")  # doctest: +SKIP
        >>> filt.contains([[1, 2, 3], [4, 5, 6]])  # doctest: +SKIP
        array([ True, False])
    """

    def __init__(self, path: Path, bits: np.ndarray, metadata: dict[str, Any]) -> None:
        self.path = path
        self.bits = bits
        self.header = header = PybloomHeader.read(metadata)
        self.seeds: list[int] = list(header.seeds)
        self.n: int = header.n
        self.num_bits: int = header.num_bits
        self.num_probes: int = len(self.seeds)
        self.num_ngrams: int = header.num_ngrams
        # The open file's identity, which guards check around their reads (None: not mapped).
        self.file_watch: FileWatch | None = None

    def contains(self, ngrams: np.ndarray | list[list[int]]) -> np.ndarray:
        """Whether each n-gram is (probably) stored, answered exactly as the library answers.

        Args:
            ngrams: integer array `(N, n)` of token ids (or `(n,)` for one n-gram).

        Returns:
            bool array `(N,)` (or a 0-d bool array for one n-gram).
        """
        array, single = self.query_rows(ngrams)
        positions = probe_positions(ngram_key_bytes(array), self.seeds, self.num_bits)
        found = np.asarray(self.bits[positions >> 3]) >> (positions & 7).astype(np.uint8)
        result = np.asarray((found & 1).astype(bool).all(axis=1))
        return result[0] if single else result

    def prefix_index(self) -> None:
        """None: this layout is not the prefix-keyed index."""
        return None

    def blocked_bits(self) -> None:
        """None: the library's k-seed probes are not memfree's blocked layout."""
        return None

    def __repr__(self) -> str:
        return (
            f"PybloomNgramFilter({str(self.path)!r}, n={self.n}, num_ngrams={self.num_ngrams}, "
            f"num_bits={self.num_bits}, num_probes={self.num_probes}, "
            f"expected_fpr={self.expected_false_positive_rate:.3g})"
        )

    def close(self) -> None:
        """Drop the mapping (queries after this fail)."""
        mapping = getattr(self.bits, "_mmap", None)
        self.bits = np.empty(0, dtype=np.uint8)
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:  # a view still uses it; it closes with that, still watched
                return
        if self.file_watch is not None:
            self.file_watch.close()

    def __enter__(self) -> PybloomNgramFilter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_pybloom(
    path: str | os.PathLike[str], *, verify: bool = True, ngram_size: int | None = None
) -> PybloomNgramFilter:
    """Open and validate a pybloomfiltermmap3 file of n-grams (parsed here, never by the library).

    Args:
        path: the filter file. Its sidecar ``<path>.json`` (from :class:`PybloomWriter`) gives n,
            tokenizer fields and checksums; without one only structural damage can be caught.
        verify: check the bit array against the sidecar's checksum (reads the whole file once).
        ngram_size: n; required without a sidecar, and must agree with the sidecar's.

    Raises:
        DamagedFilterError: the file or its sidecar is truncated, inconsistent or corrupted.
        FilterMismatchError: ``ngram_size`` differs from the sidecar's n.
        FilterError: no sidecar and no ``ngram_size``, or the file cannot be read.
    """
    path = Path(path)

    def damaged(problem: str) -> DamagedFilterError:
        return DamagedFilterError(
            f"{path}: {problem}; the pybloomfiltermmap3 file or its .json sidecar is damaged "
            "or was changed after writing, rebuild it"
        )

    try:
        # Kept open while the bits are mapped: a guard checks its identity (memfree.filterfile.filewatch).
        handle = open(path, "rb")  # noqa: SIM115
    except OSError as error:
        raise FilterError(f"{path}: cannot read the filter file ({error})") from None
    try:
        filt = _open_handle(path, handle, damaged, verify, ngram_size)
    except BaseException:
        handle.close()
        raise
    return filt


def _open_handle(
    path: Path,
    handle: BinaryIO,
    damaged: Callable[[str], DamagedFilterError],
    verify: bool,
    ngram_size: int | None,
) -> PybloomNgramFilter:
    """:func:`open_pybloom` on the open file ``handle``."""
    try:
        status = os.fstat(handle.fileno())
        file_size = status.st_size
        preamble = os.pread(handle.fileno(), PREAMBLE_BYTES, 0)
    except OSError as error:
        raise FilterError(f"{path}: cannot read the filter file ({error})") from None
    if len(preamble) < PREAMBLE_BYTES:
        raise damaged(f"only {file_size} bytes, shorter than the {PREAMBLE_BYTES}-byte preamble")
    problem, header = parse_header(preamble, file_size)
    if problem:
        raise damaged(problem)
    num_bits, num_hashes = header["num_bits"], header["num_hashes"]
    bits = np.memmap(
        handle, dtype=np.uint8, mode="r", offset=PREAMBLE_BYTES, shape=(num_bits // 8,)
    )
    sidecar = read_sidecar(path, damaged)
    if sidecar is None:
        if ngram_size is None:
            raise FilterError(
                f"{path}: a pybloomfiltermmap3 file without its sidecar {sidecar_path(path).name}; "
                "pass ngram_size (keys must be uint32le token ids) or keep the .json beside it"
            )
        if (
            not isinstance(ngram_size, int)
            or isinstance(ngram_size, bool)
            or not 1 <= ngram_size <= MAX_NGRAM_SIZE
        ):
            raise ValueError(
                f"{path}: ngram_size must be a positive integer at most "
                f"{MAX_NGRAM_SIZE}, got {ngram_size!r}"
            )
        # pybloomfiltermmap3 never writes its count back to the file, so 0 there means unknown
        counted = bool(header["count_correct"] and header["elem_count"])
        estimate = (
            header["elem_count"] if counted else estimate_num_ngrams(bits, num_bits, num_hashes)
        )
        sidecar = {"n": ngram_size, "key_encoding": KEY_ENCODING, "num_ngrams": estimate}
        sidecar["num_ngrams_estimated"] = not counted
    elif ngram_size is not None and ngram_size != sidecar["n"]:
        raise FilterMismatchError(
            f"{path}: its sidecar says n={sidecar['n']}, but ngram_size {ngram_size} "
            "was given; drop it or give the sidecar's n"
        )
    for key in ("num_bits", "num_hashes", "seeds"):
        if sidecar.get(key, header[key]) != header[key]:
            raise damaged(f"sidecar {key} {sidecar[key]!r} differs from the file's {header[key]!r}")
    if sidecar.get("header_xxh3", xxh3_hex(preamble)) != xxh3_hex(preamble):
        raise damaged("header checksum mismatch with the sidecar")
    if verify and "bits_xxh3" in sidecar and xxh3_hex(bits) != sidecar["bits_xxh3"]:
        raise damaged("bit array checksum mismatch with the sidecar")
    metadata = {**sidecar, **header, "key_bytes": 4 * sidecar["n"]}
    metadata["expected_false_positive_rate"] = expected_false_positive_rate(
        int(metadata["num_ngrams"]), num_bits, num_hashes
    )
    filt = PybloomNgramFilter(path, bits, metadata)
    # The reference a changed file is verified against: the sidecar's checksum, else the bits'
    # own as opened (a file of the library itself has none), so that a rename over the path or a
    # touch, which change the file's identity but not its bytes, never stops a guard.
    checksum = sidecar.get("bits_xxh3")
    if not isinstance(checksum, str):
        checksum = xxh3_hex(bits)

    def intact() -> str | None:  # holds the bits, not the filter: no reference cycle
        if os.pread(handle.fileno(), PREAMBLE_BYTES, 0) != preamble:
            return "its header changed"
        if xxh3_hex(bits) != checksum:
            return "its bit array changed"
        return None

    filt.file_watch = FileWatch(path, handle, FileIdentity.of(status), intact)
    return filt


# The reader here; the format's constants, sidecar_path and the writer keep their old import path.
__all__ = [
    "BF_VERSION",
    "HASH_SCHEME",
    "HEADER_BYTES",
    "KEY_ENCODING",
    "LAYOUT",
    "MAGIC",
    "PREAMBLE_BYTES",
    "PybloomNgramFilter",
    "PybloomWriter",
    "expected_false_positive_rate",
    "open_pybloom",
    "sidecar_path",
]
