"""Interchange with pybloomfiltermmap3 0.6 files: a strict reader (which answers the same read
Protocol as memfree's own filter) and a deterministic writer; the library's hashing, replicated in
numpy, is in :mod:`memfree.pybloom_hash`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import xxhash

from memfree.errors import DamagedFilterError, FilterError, FilterMismatchError
from memfree.fileio import atomic_write
from memfree.filewatch import FileIdentity, FileWatch
from memfree.header import MAX_NGRAM_SIZE
from memfree.pybloom_hash import (  # expected_false_positive_rate: re-exported for the builder
    MAX_HASHES,
    derive_seeds,
    estimate_num_ngrams,
    expected_false_positive_rate,
    library_size,
    ngram_key_bytes,
    probe_positions,
)

MAGIC = b"MBITARRAY"
LAYOUT = "pybloomfiltermmap3"
HASH_SCHEME = "murmur3_x64_128-xor-mod"
KEY_ENCODING = "uint32le"
BF_VERSION = 1  # BF_CURRENT_VERSION in the library's bloomfilter.h
HEADER_BYTES = 1200  # sizeof(struct _BloomFilter) on 64-bit platforms
PREAMBLE_BYTES = 1280  # magic, uint64 num_bits, int32 header length, struct; rounded up to 256
_PREFIX = struct.Struct("<9sQi")
# struct _BloomFilter: max_num_elem, error_rate, num_hashes, hash_seeds[256], pad, array pointer,
# bf_version, count_correct, pad, elem_count, reserved[32]
_BLOOM = struct.Struct("<QdI256I4s8sBB6sQ128s")


class PybloomNgramFilter:
    """A read-only n-gram set in a pybloomfiltermmap3 file; open it with :func:`open_pybloom`.

    Implements :class:`memfree.filter.NgramSet` (the read API every filter format shares) without
    subclassing :class:`~memfree.filter.NgramFilter`: its n-grams are not in memfree's blocked
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
        self._metadata = metadata
        self.seeds: list[int] = list(metadata["seeds"])
        self.n: int = int(metadata["n"])
        self.num_bits: int = int(metadata["num_bits"])
        self.num_probes: int = len(self.seeds)
        self.num_ngrams: int = int(metadata["num_ngrams"])
        # The open file's identity, which guards check around their reads (None: not mapped).
        self.file_watch: FileWatch | None = None

    def contains(self, ngrams: np.ndarray | list[list[int]]) -> np.ndarray:
        """Whether each n-gram is (probably) stored, answered exactly as the library answers.

        Args:
            ngrams: integer array `(N, n)` of token ids (or `(n,)` for one n-gram).

        Returns:
            bool array `(N,)` (or a 0-d bool array for one n-gram).
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
        positions = probe_positions(ngram_key_bytes(array), self.seeds, self.num_bits)
        found = np.asarray(self.bits[positions >> 3]) >> (positions & 7).astype(np.uint8)
        result = np.asarray((found & 1).astype(bool).all(axis=1))
        return result[0] if single else result

    def blocked_bits(self) -> None:
        """None: the library's k-seed probes are not memfree's blocked layout."""
        return None

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of the sidecar's and the file header's fields."""
        return json.loads(json.dumps(self._metadata))

    @property
    def unit(self) -> str:
        """``"token"`` (n-grams of token ids) or ``"word"`` (n-grams of normalized words)."""
        return str(self._metadata.get("unit", "token"))

    @property
    def layout(self) -> str:
        return str(self._metadata["layout"])

    @property
    def special_token_ids(self) -> tuple[int, ...] | None:
        """Ids the builder cut token sequences at (no stored n-gram holds one), if recorded."""
        ids = self._metadata.get("special_token_ids")
        return None if ids is None else tuple(int(i) for i in ids)

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size

    @property
    def expected_false_positive_rate(self) -> float:
        return float(self._metadata["expected_false_positive_rate"])

    def __len__(self) -> int:
        return self.num_ngrams

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


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where memfree keeps the JSON metadata of a pybloomfiltermmap3 file: ``<path>.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def _parse_header(preamble: bytes, file_size: int) -> tuple[str | None, dict[str, Any]]:
    """The header's fields, and the first problem found (None for a sound header)."""
    magic, num_bits, header_len = _PREFIX.unpack_from(preamble)
    if magic != MAGIC:
        return f"bad magic bytes {magic!r}, expected {MAGIC!r}", {}
    if header_len != HEADER_BYTES:
        return f"header length {header_len}, expected {HEADER_BYTES}", {}
    capacity, error_rate, num_hashes, *rest = _BLOOM.unpack_from(preamble, _PREFIX.size)
    slots = rest[:MAX_HASHES]
    pad, _pointer, bf_version, count_correct, pad2, elem_count, reserved = rest[MAX_HASHES:]
    expected_size = PREAMBLE_BYTES + num_bits // 8
    if not 1 <= num_hashes <= MAX_HASHES:
        problem = f"num_hashes is {num_hashes}, must be in [1, {MAX_HASHES}]"
    elif num_bits == 0 or num_bits % 8:  # the library sizes every filter in whole bytes
        problem = f"num_bits is {num_bits}, must be a positive multiple of 8"
    elif file_size != expected_size:
        problem = f"size {file_size} bytes, expected {expected_size} for num_bits={num_bits}"
    elif not (math.isfinite(error_rate) and 0.0 < error_rate < 1.0):
        problem = f"error_rate is {error_rate!r}, must be in (0, 1)"
    elif any(slots[num_hashes:]) or len(set(slots[:num_hashes])) < num_hashes:
        problem = f"hash seeds do not fit num_hashes={num_hashes} (unused slots set or repeats)"
    elif bf_version != BF_VERSION or count_correct > 1:
        problem = f"bf_version {bf_version} (expected 1) or count_correct {count_correct} (0 or 1)"
    elif any(pad + pad2 + reserved + preamble[_PREFIX.size + HEADER_BYTES :]):
        problem = "padding or reserved bytes are not zero"
    else:
        problem = None
    fields = {
        "layout": LAYOUT,
        "hash_scheme": HASH_SCHEME,
        "num_bits": num_bits,
        "num_hashes": num_hashes,
        "num_probes": num_hashes,
        "seeds": slots[:num_hashes],
        "capacity": capacity,
        "error_rate": error_rate,
        "bf_version": bf_version,
        "count_correct": count_correct,
        "elem_count": elem_count,
    }
    return problem, fields


def _read_sidecar(path: Path, damaged: Callable[[str], Exception]) -> dict[str, Any] | None:
    sidecar = sidecar_path(path)
    if not sidecar.exists():
        return None
    try:
        loaded = json.loads(sidecar.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as error:  # UnicodeDecodeError and JSONDecodeError included
        raise damaged(f"unreadable sidecar {sidecar.name} ({error})") from None
    if not isinstance(loaded, dict):
        raise damaged(f"sidecar {sidecar.name} is not a JSON object")
    for key, minimum in (("n", 1), ("num_ngrams", 0)):
        value = loaded.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise damaged(f"sidecar field {key!r} is {value!r}, expected an integer >= {minimum}")
    if loaded["n"] > MAX_NGRAM_SIZE:
        raise damaged(f"sidecar field 'n' is {loaded['n']}, must be in [1, {MAX_NGRAM_SIZE}]")
    if loaded.get("key_encoding") != KEY_ENCODING:
        raise damaged(
            f"sidecar key_encoding is {loaded.get('key_encoding')!r}, not {KEY_ENCODING!r}"
        )
    if loaded.get("key_bytes", 4 * loaded["n"]) != 4 * loaded["n"]:
        raise damaged(f"sidecar key_bytes {loaded['key_bytes']!r} does not fit n={loaded['n']}")
    return loaded


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
        # Kept open while the bits are mapped: a guard checks its identity (memfree.filewatch).
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
    problem, header = _parse_header(preamble, file_size)
    if problem:
        raise damaged(problem)
    num_bits, num_hashes = header["num_bits"], header["num_hashes"]
    bits = np.memmap(
        handle, dtype=np.uint8, mode="r", offset=PREAMBLE_BYTES, shape=(num_bits // 8,)
    )
    sidecar = _read_sidecar(path, damaged)
    if sidecar is None:
        if ngram_size is None:
            raise FilterError(
                f"{path}: a pybloomfiltermmap3 file without its sidecar {sidecar_path(path).name}; "
                "pass ngram_size= (--ngram-size on the command line; keys must be uint32le "
                "token ids) or keep the .json beside it"
            )
        if (
            not isinstance(ngram_size, int)
            or isinstance(ngram_size, bool)
            or not 1 <= ngram_size <= MAX_NGRAM_SIZE
        ):
            raise ValueError(
                f"{path}: ngram_size (--ngram-size) must be a positive integer at most "
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
            f"{path}: its sidecar says n={sidecar['n']}, but ngram_size={ngram_size} "
            "(--ngram-size) was given; drop it or give the sidecar's n"
        )
    for key in ("num_bits", "num_hashes", "seeds"):
        if sidecar.get(key, header[key]) != header[key]:
            raise damaged(f"sidecar {key} {sidecar[key]!r} differs from the file's {header[key]!r}")
    if sidecar.get("header_xxh3", _xxh3(preamble)) != _xxh3(preamble):
        raise damaged("header checksum mismatch with the sidecar")
    if verify and "bits_xxh3" in sidecar and _xxh3(bits) != sidecar["bits_xxh3"]:
        raise damaged("bit array checksum mismatch with the sidecar")
    metadata = {**sidecar, **header, "key_bytes": 4 * sidecar["n"]}
    metadata["expected_false_positive_rate"] = expected_false_positive_rate(
        int(metadata["num_ngrams"]), num_bits, num_hashes
    )
    filt = PybloomNgramFilter(path, bits, metadata)
    checksum = sidecar.get("bits_xxh3")

    def intact() -> str | None:  # holds the bits, not the filter: no reference cycle
        if os.pread(handle.fileno(), PREAMBLE_BYTES, 0) != preamble:
            return "its header changed"
        if _xxh3(bits) != checksum:
            return "its bit array changed"
        return None

    # Without a recorded checksum the bits cannot be verified again: any change stops a guard.
    filt.file_watch = FileWatch(
        path, handle, FileIdentity.of(status), intact if isinstance(checksum, str) else None
    )
    return filt


def _xxh3(data: bytes | np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(data.data if isinstance(data, np.ndarray) else data)


class PybloomWriter:
    """Builds a pybloomfiltermmap3 file of token n-grams, sized as ``BloomFilter(capacity, p)``.

    Seeds derive from ``hash_seed`` (the library's are random): the same inputs give the same bytes.

    Args:
        capacity: n-grams the filter is sized for (the library's ``capacity``).
        error_rate: target false-positive rate at capacity, in (0, 1).
        hash_seed: 64-bit seed from which the ``num_hashes`` distinct 32-bit probe seeds derive.

    Example:
        >>> writer = PybloomWriter(capacity=1000, error_rate=0.01, hash_seed=7)
        >>> writer.add_ngrams(np.array([[1, 2, 3], [2, 3, 4]]))
        >>> writer.write("ngrams.bloom", {"unit": "token"}, num_ngrams=2)  # doctest: +SKIP
    """

    def __init__(self, capacity: int, error_rate: float, hash_seed: int) -> None:
        if not isinstance(capacity, int) or not 0 <= capacity < 1 << 64:
            raise ValueError(f"capacity must be an integer in [0, 2**64), got {capacity!r}")
        if not 0.0 < error_rate < 1.0:
            raise ValueError(f"error_rate must be in (0, 1), got {error_rate!r}")
        if not isinstance(hash_seed, int) or not 0 <= hash_seed < 1 << 64:
            raise ValueError(f"hash_seed must be an integer in [0, 2**64), got {hash_seed!r}")
        self.capacity, self.error_rate, self.hash_seed = capacity, float(error_rate), hash_seed
        self.num_hashes, self.num_bits = library_size(capacity, self.error_rate)
        self.seeds: list[int] = derive_seeds(hash_seed, self.num_hashes)
        self.bits = np.zeros(self.num_bits // 8, dtype=np.uint8)
        self.n: int | None = None

    def add_ngrams(self, ngrams: np.ndarray, chunk: int = 1 << 18) -> None:
        """Set the probe bits of each n-gram (integer array `(N, n)`, the same n in every call)."""
        array = np.asarray(ngrams)
        if array.ndim != 2 or array.shape[1] < 1 or self.n not in (None, array.shape[1]):
            raise ValueError(f"ngrams must have shape (N, {self.n or 'n'}), got {array.shape}")
        self.n = int(array.shape[1])
        for begin in range(0, array.shape[0], chunk):
            keys = ngram_key_bytes(array[begin : begin + chunk])
            positions = probe_positions(keys, self.seeds, self.num_bits).ravel()
            masks = np.left_shift(1, positions & 7).astype(np.uint8)
            np.bitwise_or.at(self.bits, positions >> 3, masks)

    def write(
        self, path: str | os.PathLike[str], metadata: dict[str, Any], num_ngrams: int
    ) -> Path:
        """Write the library's file format and the ``<path>.json`` sidecar, each atomically.

        Args:
            path: output file.
            metadata: JSON-serializable fields to keep (tokenizer name and fingerprint, corpus
                summary, ...); may give ``n`` when no n-gram was added.
            num_ngrams: distinct n-grams added; the library reports it as ``len()``.

        Returns:
            The path of the filter file.
        """
        path = Path(path)
        ngram_size = metadata.get("n", self.n)
        if not isinstance(ngram_size, int) or ngram_size < 1 or self.n not in (None, ngram_size):
            raise ValueError(
                f"n is unknown or inconsistent: added {self.n}, metadata {ngram_size!r}"
            )
        if not isinstance(num_ngrams, int) or num_ngrams < 0:
            raise ValueError(f"num_ngrams must be a non-negative integer, got {num_ngrams!r}")
        slots = self.seeds + [0] * (MAX_HASHES - self.num_hashes)
        header = _BLOOM.pack(
            self.capacity, self.error_rate, self.num_hashes, *slots, bytes(4), bytes(8),
            BF_VERSION, 1, bytes(6), num_ngrams, bytes(128),
        )  # fmt: skip
        preamble = _PREFIX.pack(MAGIC, self.num_bits, HEADER_BYTES) + header
        preamble += bytes(PREAMBLE_BYTES - len(preamble))
        problem, fields = _parse_header(preamble, PREAMBLE_BYTES + len(self.bits))
        if problem:  # e.g. a capacity beyond uint64
            raise ValueError(f"cannot write {path}: {problem}")
        full = {
            **metadata,
            **fields,
            "n": ngram_size,
            "key_encoding": KEY_ENCODING,
            "key_bytes": 4 * ngram_size,
            "num_ngrams": num_ngrams,
            "hash_seed": self.hash_seed,
            "bits_xxh3": _xxh3(self.bits),
            "header_xxh3": _xxh3(preamble),
            "expected_false_positive_rate": expected_false_positive_rate(
                num_ngrams, self.num_bits, self.num_hashes
            ),
        }
        try:
            sidecar = json.dumps(full, sort_keys=True, indent=1, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as error:
            raise TypeError(f"metadata must be JSON-serializable ({error})") from None
        atomic_write(path, [preamble, self.bits.data])
        atomic_write(sidecar_path(path), [sidecar])
        return path
