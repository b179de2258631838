"""Interchange with pybloomfiltermmap3 0.6 files: a strict reader, a deterministic writer, and a
numpy replica of the library's k-seed MurmurHash3_x64_128 probes (keys: token ids as uint32le).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from memfree.errors import DamagedFilterError, FilterError, FilterMismatchError
from memfree.filter import NgramFilter, _atomic_write

MAGIC = b"MBITARRAY"
LAYOUT = "pybloomfiltermmap3"
HASH_SCHEME = "murmur3_x64_128-xor-mod"
KEY_ENCODING = "uint32le"
BF_VERSION = 1  # BF_CURRENT_VERSION in the library's bloomfilter.h
MAX_HASHES = 256
HEADER_BYTES = 1200  # sizeof(struct _BloomFilter) on 64-bit platforms
PREAMBLE_BYTES = 1280  # magic, uint64 num_bits, int32 header length, struct; rounded up to 256
_PREFIX = struct.Struct("<9sQi")
# struct _BloomFilter: max_num_elem, error_rate, num_hashes, hash_seeds[256], pad, array pointer,
# bf_version, count_correct, pad, elem_count, reserved[32]
_BLOOM = struct.Struct("<QdI256I4s8sBB6sQ128s")
_C1, _C2 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)


def ngram_key_bytes(ngrams: np.ndarray) -> np.ndarray:
    """Library keys of n-grams: each token id as 4 little-endian bytes.

    Args:
        ngrams: integer array `(N, n)` of token ids in ``[0, 2**32)``.

    Returns:
        uint8 array `(N, 4 * n)`.
    """
    array = np.asarray(ngrams)
    if array.ndim != 2:
        raise ValueError(f"ngrams must be a 2-D (N, n) array, got shape {array.shape}")
    if array.size and (
        not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() >= 1 << 32
    ):
        raise ValueError("ngrams must hold integer token ids in [0, 2**32)")
    key_bytes = np.ascontiguousarray(array, dtype="<u4").view(np.uint8)
    return key_bytes.reshape(array.shape[0], 4 * array.shape[1])


def _rotl(values: np.ndarray, shift: int) -> np.ndarray:
    return (values << np.uint64(shift)) | (values >> np.uint64(64 - shift))


def _fmix64(values: np.ndarray) -> np.ndarray:
    values = values ^ (values >> np.uint64(33))
    values = values * np.uint64(0xFF51AFD7ED558CCD)
    values = values ^ (values >> np.uint64(33))
    values = values * np.uint64(0xC4CEB9FE1A85EC53)
    return values ^ (values >> np.uint64(33))


def murmur3_x64_128_xor(keys: np.ndarray, seed: int) -> np.ndarray:
    """MurmurHash3_x64_128 of each key, returned as ``h1 ^ h2`` (what the library probes with).

    Args:
        keys: uint8 array `(N, L)`, one key of L bytes per row (any L >= 0).
        seed: 32-bit seed.

    Returns:
        uint64 array `(N,)`.
    """
    keys = np.ascontiguousarray(keys, dtype=np.uint8)
    if keys.ndim != 2:
        raise ValueError(f"keys must be a 2-D (N, L) uint8 array, got shape {keys.shape}")
    num_keys, key_bytes = keys.shape
    num_blocks, tail_bytes = divmod(key_bytes, 16)
    if tail_bytes:  # zero bytes beyond the key leave the tail words as the C switch builds them
        keys = np.concatenate([keys, np.zeros((num_keys, 16 - tail_bytes), np.uint8)], axis=1)
    lanes = keys.view("<u8").astype(np.uint64) if keys.shape[1] else keys.astype(np.uint64)
    h1 = np.full(num_keys, seed & 0xFFFFFFFF, dtype=np.uint64)
    h2 = h1.copy()
    with np.errstate(over="ignore"):
        for block in range(num_blocks):
            h1 ^= _rotl(lanes[:, 2 * block] * _C1, 31) * _C2
            h1 = (_rotl(h1, 27) + h2) * np.uint64(5) + np.uint64(0x52DCE729)
            h2 ^= _rotl(lanes[:, 2 * block + 1] * _C2, 33) * _C1
            h2 = (_rotl(h2, 31) + h1) * np.uint64(5) + np.uint64(0x38495AB5)
        if tail_bytes > 8:
            h2 ^= _rotl(lanes[:, 2 * num_blocks + 1] * _C2, 33) * _C1
        if tail_bytes:
            h1 ^= _rotl(lanes[:, 2 * num_blocks] * _C1, 31) * _C2
        h1 ^= np.uint64(key_bytes)
        h2 ^= np.uint64(key_bytes)
        h1 += h2
        h2 += h1
        h1, h2 = _fmix64(h1), _fmix64(h2)
        h1 += h2
        h2 += h1
    result: np.ndarray = h1 ^ h2
    return result


def probe_positions(keys: np.ndarray, seeds: list[int], num_bits: int) -> np.ndarray:
    """Bit positions the library sets for each key; int64 `(N, len(seeds))`."""
    columns = [murmur3_x64_128_xor(keys, seed) % np.uint64(num_bits) for seed in seeds]
    return np.stack(columns, axis=1).astype(np.int64).reshape(len(keys), len(seeds))


def expected_false_positive_rate(num_ngrams: int, num_bits: int, num_hashes: int) -> float:
    """The standard Bloom filter estimate ``(1 - exp(-k N / m)) ** k``."""
    return float((1.0 - math.exp(-num_hashes * num_ngrams / num_bits)) ** num_hashes)


class PybloomNgramFilter(NgramFilter):
    """A read-only n-gram set in a pybloomfiltermmap3 file; open it with :func:`open_pybloom`.

    Same query API as :class:`NgramFilter`. ``bits`` is the memory-mapped bit array (uint8; bit b
    is ``bits[b >> 3] >> (b & 7) & 1``), ``seeds`` the library's hash seeds. The native
    fingerprint path (``contains_fingerprints``, ``words``) does not apply and raises.
    """

    def __init__(self, path: Path, bits: np.ndarray, metadata: dict[str, Any]) -> None:
        self.path = path
        self.bits = bits
        self._metadata = metadata
        self.seeds: list[int] = list(metadata["seeds"])
        self.n = int(metadata["n"])
        self.num_bits = int(metadata["num_bits"])
        self.num_probes = len(self.seeds)
        self.num_ngrams = int(metadata["num_ngrams"])

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

    def contains_fingerprints(self, fingerprints: np.ndarray) -> np.ndarray:
        raise FilterError(
            f"{self.path}: a pybloomfiltermmap3 filter has no memfree fingerprints; query token "
            "n-grams with contains(), or rebuild it as a native filter with `memfree build`"
        )

    @property
    def words(self) -> np.ndarray:
        raise FilterError(
            f"{self.path}: a pybloomfiltermmap3 filter has no blocked words; use .bits"
        )

    def __repr__(self) -> str:
        return "Pybloom" + super().__repr__()

    def close(self) -> None:
        """Drop the mapping (queries after this fail)."""
        mapping = getattr(self.bits, "_mmap", None)
        self.bits = np.empty(0, dtype=np.uint8)
        if mapping is not None:
            with contextlib.suppress(BufferError):  # a view still uses it; it closes with that
                mapping.close()


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where memfree keeps the JSON metadata of a pybloomfiltermmap3 file: ``<path>.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def estimate_num_ngrams(bits: np.ndarray, num_bits: int, num_hashes: int) -> int:
    """The library's ``approx_len``, ``-(m / k) ln(1 - X / m)`` for X bits set."""
    popcount = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).sum(axis=1)
    chunk = 1 << 24
    bits_set = sum(int(popcount[bits[i : i + chunk]].sum()) for i in range(0, len(bits), chunk))
    return round(-num_bits / num_hashes * math.log1p(-min(bits_set / num_bits, 1 - 1e-12)))


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
        file_size = path.stat().st_size
        with open(path, "rb") as handle:
            preamble = handle.read(PREAMBLE_BYTES)
    except OSError as error:
        raise FilterError(f"{path}: cannot read the filter file ({error})") from None
    if len(preamble) < PREAMBLE_BYTES:
        raise damaged(f"only {file_size} bytes, shorter than the {PREAMBLE_BYTES}-byte preamble")
    problem, header = _parse_header(preamble, file_size)
    if problem:
        raise damaged(problem)
    num_bits, num_hashes = header["num_bits"], header["num_hashes"]
    bits = np.memmap(path, dtype=np.uint8, mode="r", offset=PREAMBLE_BYTES, shape=(num_bits // 8,))
    sidecar = _read_sidecar(path, damaged)
    if sidecar is None:
        if ngram_size is None:
            raise FilterError(
                f"{path}: a pybloomfiltermmap3 file without its sidecar {sidecar_path(path).name}; "
                "pass ngram_size= (keys must be uint32le token ids) or keep the .json beside it"
            )
        if not isinstance(ngram_size, int) or ngram_size < 1:
            raise ValueError(
                f"{path}: ngram_size (--ngram-size) must be a positive integer, got {ngram_size!r}"
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
            f"{path}: its sidecar says n={sidecar['n']}, but ngram_size={ngram_size} was given"
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
    return PybloomNgramFilter(path, bits, metadata)


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
        # the library's _create: k rounded down, then whole bytes, at least 128 bits
        self.num_hashes = min(max(math.floor(math.log2(1 / error_rate)), 1), MAX_HASHES)
        bits_per_hash = math.ceil(
            capacity * abs(math.log(error_rate)) / (self.num_hashes * math.log(2) ** 2)
        )
        self.num_bits = max(math.ceil(self.num_hashes * bits_per_hash / 8.0) * 8, 128)
        self.seeds: list[int] = []
        for counter in itertools.count():
            seed = xxhash.xxh64_intdigest(counter.to_bytes(8, "little"), seed=hash_seed)
            if seed & 0xFFFFFFFF not in self.seeds:
                self.seeds.append(seed & 0xFFFFFFFF)
            if len(self.seeds) == self.num_hashes:
                break
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
        _atomic_write(path, [preamble, self.bits.data])
        _atomic_write(sidecar_path(path), [sidecar])
        return path
