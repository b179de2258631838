"""The n-gram filter file: a validated, memory-mapped, cache-line-blocked Bloom filter.

Layout (all integers little-endian)::

    offset 0   8 bytes   magic b"MEMFREE\\0"
    offset 8   uint32    format version
    offset 12  uint32    length L of the JSON metadata
    offset 16  uint64    xxh3-64 of the JSON metadata bytes
    offset 24  L bytes   UTF-8 JSON metadata (sorted keys), zero padding up to a multiple of 4096
    then       uint64    bit words, ``num_blocks * 8`` of them (page-aligned, so numpy.memmap and
                         torch.from_numpy map them without copying)
    then       uint64    optional prefix section: ``prefix.num_blocks * 8`` bit words of a second
                         blocked Bloom filter holding the (n-1)-token prefixes of stored n-grams

The metadata records everything that produced the file and an xxh3-64 checksum of each bit array.
The same inputs give the same bytes: there is no wall-clock field.

With a prefix section, an n-gram is a member when its prefix *and* the n-gram are both found.
That is still free of false negatives (every stored n-gram's prefix is in the prefix section) and
lets the guard skip, exactly, every decoding step whose last n-1 tokens begin no stored n-gram.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from memfree.errors import DamagedFilterError, FilterError
from memfree.hashing import (
    BLOCK_BITS,
    DEFAULT_HASH_SEED,
    HASH_SCHEME,
    WORDS_PER_BLOCK,
    fingerprints_np,
    probe_positions_np,
    query_bits_np,
)
from memfree.header import LAYOUT, check_metadata, count_set_bits, fill_problem
from memfree.sizing import choose_size, expected_false_positive_rate

MAGIC = b"MEMFREE\x00"
FORMAT_VERSION = 1
PAGE_BYTES = 4096
_PREAMBLE = struct.Struct("<8sIIQ")
_MAX_METADATA_BYTES = 16 << 20
# The prefix section only decides when the guard may skip a row, so a looser rate than the
# n-gram array's keeps it small (about 10 bits per prefix) while still skipping 99% of the
# steps whose prefix begins no stored n-gram.
DEFAULT_PREFIX_FALSE_POSITIVE_RATE = 0.01


def _page_round(size_bytes: int) -> int:
    return (size_bytes + PAGE_BYTES - 1) // PAGE_BYTES * PAGE_BYTES


class NgramFilter:
    """A read-only set of token n-grams backed by one memory-mapped file.

    Open with :meth:`open` (validates magic, version, size, parameters and checksum) or write
    one with :meth:`create`. Queries never produce false negatives.

    Example:
        >>> filt = NgramFilter.open("stdlib.memfree")  # doctest: +SKIP
        >>> filt.contains([[1, 2, 3], [4, 5, 6]])  # doctest: +SKIP
        array([ True, False])
    """

    def __init__(
        self,
        path: Path,
        words: np.ndarray,
        metadata: dict[str, Any],
        prefix_words: np.ndarray | None = None,
    ) -> None:
        self.path = path
        self._words = words
        self._prefix_words = prefix_words
        self._metadata = metadata
        prefix = metadata.get("prefix") or {}
        self.prefix_num_probes: int = int(prefix.get("num_probes", 0))
        self.n: int = int(metadata["n"])
        self.num_bits: int = int(metadata["num_bits"])
        self.num_probes: int = int(metadata["num_probes"])
        self.hash_seed: int = int(metadata["hash_seed"])
        self.num_ngrams: int = int(metadata["num_ngrams"])

    # -- opening and creating ----------------------------------------------------------------

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, verify: bool = True, **kwargs: Any
    ) -> NgramFilter:
        """Open and validate a filter file.

        Args:
            path: a memfree filter, or a pybloomfiltermmap3 file (with its ``.json`` sidecar, or
                ``ngram_size=`` given).
            verify: check the bit array's checksum (reads the whole file once).
            **kwargs: passed to the pybloomfiltermmap3 reader (``ngram_size``).

        Raises:
            FileNotFoundError: the path does not exist.
            DamagedFilterError: the file is truncated, damaged, of another version or not a filter.
        """
        path = Path(path)
        try:
            mode = path.stat().st_mode
            if stat.S_ISDIR(mode):
                raise FilterError(f"{path}: is a directory, not a filter file")
            if not stat.S_ISREG(mode):
                raise FilterError(f"{path}: not a regular file (a device, socket or pipe)")
            with open(path, "rb") as handle:
                head = handle.read(_PREAMBLE.size)
        except FileNotFoundError:
            if path.is_symlink():
                raise FileNotFoundError(
                    f"{path}: a symbolic link to {os.readlink(path)!r}, which does not exist"
                ) from None
            raise FileNotFoundError(
                f"{path}: no such filter file; build one with `memfree build`"
            ) from None
        except OSError as error:  # a symbolic link loop, no permission, ...
            raise FilterError(
                f"{path}: cannot read the filter file ({error.strerror or error})"
            ) from None
        from memfree import pybloom

        if head.startswith(pybloom.MAGIC):
            return pybloom.open_pybloom(path, verify=verify, **kwargs)
        if kwargs:
            raise TypeError(f"unexpected arguments for a memfree filter: {sorted(kwargs)}")
        return cls._open_native(path, head, verify)

    @classmethod
    def _open_native(cls, path: Path, head: bytes, verify: bool) -> NgramFilter:
        def damaged(problem: str) -> DamagedFilterError:
            return DamagedFilterError(
                f"{path}: {problem}; the file is damaged or not a memfree filter, rebuild it with "
                "`memfree build`"
            )

        if len(head) < _PREAMBLE.size:
            raise damaged(
                f"only {len(head)} bytes, shorter than the {_PREAMBLE.size}-byte preamble"
            )
        magic, version, metadata_bytes, metadata_hash = _PREAMBLE.unpack(head)
        if magic != MAGIC:
            raise damaged(f"bad magic bytes {magic!r}")
        if version != FORMAT_VERSION:
            raise DamagedFilterError(
                f"{path}: format version {version}, this memfree reads version {FORMAT_VERSION}; "
                "rebuild the filter or upgrade memfree"
            )
        file_size = path.stat().st_size
        if metadata_bytes > _MAX_METADATA_BYTES or _PREAMBLE.size + metadata_bytes > file_size:
            raise damaged(f"metadata length {metadata_bytes} does not fit in {file_size} bytes")
        with open(path, "rb") as handle:
            handle.seek(_PREAMBLE.size)
            raw = handle.read(metadata_bytes)
        if xxhash.xxh3_64_intdigest(raw) != metadata_hash:
            raise damaged("metadata checksum mismatch")
        try:
            metadata = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise damaged(f"unreadable metadata ({error})") from None
        problem = check_metadata(metadata)
        if problem:
            raise damaged(problem)
        data_offset = _page_round(_PREAMBLE.size + metadata_bytes)
        num_words = int(metadata["num_bits"]) // 64
        prefix = metadata.get("prefix")
        prefix_words_count = int(prefix["num_bits"]) // 64 if prefix else 0
        expected_size = data_offset + (num_words + prefix_words_count) * 8
        if file_size != expected_size:
            raise damaged(f"size {file_size} bytes, expected {expected_size} from its header")
        # mode "c": copy-on-write, so torch.from_numpy gets a writable view without a copy while
        # the file itself can never be changed through this mapping.
        words = np.memmap(path, dtype="<u8", mode="c", offset=data_offset, shape=(num_words,))
        if verify and xxhash.xxh3_64_hexdigest(words.data.cast("B")) != metadata["bits_xxh3"]:
            raise damaged("bit array checksum mismatch")
        prefix_words = None
        if prefix:
            prefix_words = np.memmap(
                path,
                dtype="<u8",
                mode="c",
                offset=data_offset + num_words * 8,
                shape=(prefix_words_count,),
            )
            if (
                verify
                and xxhash.xxh3_64_hexdigest(prefix_words.data.cast("B")) != prefix["bits_xxh3"]
            ):
                raise damaged("prefix bit array checksum mismatch")
        if verify:
            problem = fill_problem(
                "the bit array",
                count_set_bits(words),
                metadata["num_ngrams"],
                metadata["num_bits"],
                metadata["num_probes"],
            )
            if not problem and prefix_words is not None:
                problem = fill_problem(
                    "the prefix section",
                    count_set_bits(prefix_words),
                    prefix["num_prefixes"],
                    prefix["num_bits"],
                    prefix["num_probes"],
                )
            if problem:
                raise damaged(problem)
        return cls(path, words, metadata, prefix_words)

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        words: np.ndarray,
        metadata: Mapping[str, Any],
    ) -> NgramFilter:
        """Write a filter file atomically (temporary name, then rename) and open it.

        Args:
            path: output path; never left half-written.
            words: uint64 array `(num_blocks * 8,)` of bit words.
            metadata: must hold ``n``, ``num_probes``, ``hash_seed`` and ``num_ngrams``; layout,
                sizes, expected false-positive rate and checksum are filled in here.
        """
        write_filter(path, words, metadata)
        return cls.open(path)

    @classmethod
    def from_ngrams(
        cls,
        path: str | os.PathLike[str],
        ngrams: np.ndarray | list[list[int]],
        *,
        false_positive_rate: float = 1e-3,
        prefix_false_positive_rate: float | None = DEFAULT_PREFIX_FALSE_POSITIVE_RATE,
        hash_seed: int = DEFAULT_HASH_SEED,
        metadata: Mapping[str, Any] | None = None,
    ) -> NgramFilter:
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
        array = np.asarray(ngrams)
        if array.ndim != 2 or array.shape[1] < 1:
            raise ValueError(f"ngrams must be a 2-D (N, n) array with n >= 1, got {array.shape}")
        if array.size and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0):
            raise ValueError("ngrams must hold non-negative integer token ids")
        array = np.unique(array.astype(np.int64), axis=0)
        fingerprints = fingerprints_np(array, hash_seed)
        size = choose_size(array.shape[0], false_positive_rate)
        words = bits_from_fingerprints(fingerprints, size.num_blocks, size.num_probes)
        header = {"unit": "token", "n": int(array.shape[1]), "min_count": 1, **(metadata or {})}
        header.update(
            n=int(array.shape[1]),
            hash_seed=hash_seed,
            num_probes=size.num_probes,
            num_ngrams=int(array.shape[0]),
            target_false_positive_rate=false_positive_rate,
        )
        prefix_words, prefix_probes, num_prefixes = None, 0, 0
        if prefix_false_positive_rate is not None and array.shape[1] > 1:
            prefixes = np.unique(array[:, :-1], axis=0)
            num_prefixes = int(prefixes.shape[0])
            prefix_size = choose_size(num_prefixes, prefix_false_positive_rate)
            prefix_probes = prefix_size.num_probes
            prefix_words = bits_from_fingerprints(
                fingerprints_np(prefixes, hash_seed), prefix_size.num_blocks, prefix_probes
            )
        write_filter(path, words, header, prefix_words, prefix_probes, num_prefixes)
        return cls.open(path)

    # -- queries --------------------------------------------------------------------------------

    def contains(self, ngrams: np.ndarray | list[list[int]]) -> np.ndarray:
        """Whether each n-gram is (probably) stored; never a false negative.

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
        if array.size and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0):
            raise ValueError("ngrams must hold non-negative integer token ids")
        result = self.contains_fingerprints(fingerprints_np(array, self.hash_seed))
        if self._prefix_words is not None and self.n > 1:
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
        if self._prefix_words is None or self.n == 1:
            return np.ones(array.shape[0], dtype=bool)
        return query_bits_np(
            self._prefix_words, fingerprints_np(array, self.hash_seed), self.prefix_num_probes
        )

    def contains_fingerprints(self, fingerprints: np.ndarray) -> np.ndarray:
        """Membership of precomputed n-gram fingerprints in the n-gram bit array alone.

        Args:
            fingerprints: uint64 `(N,)` from :func:`memfree.hashing.fingerprints_np`.

        Returns:
            bool `(N,)`. The prefix section is not consulted, so this is a superset of
            :meth:`contains` (still no false negatives).
        """
        return query_bits_np(
            self._words, np.asarray(fingerprints, dtype=np.uint64), self.num_probes
        )

    # -- properties -----------------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of the header's JSON metadata."""
        return json.loads(json.dumps(self._metadata))

    @property
    def words(self) -> np.ndarray:
        """The bit array as little-endian uint64 words (memory-mapped, do not write)."""
        return self._words

    @property
    def prefix_words(self) -> np.ndarray | None:
        """The prefix section's uint64 words, or None when the file has none."""
        return self._prefix_words

    @property
    def special_token_ids(self) -> tuple[int, ...] | None:
        """Ids the builder cut token sequences at (no stored n-gram holds one), if recorded."""
        ids = self._metadata.get("special_token_ids")
        return None if ids is None else tuple(int(i) for i in ids)

    @property
    def unit(self) -> str:
        """``"token"`` (n-grams of token ids) or ``"word"`` (n-grams of normalized words)."""
        return str(self._metadata.get("unit", "token"))

    @property
    def has_prefix_section(self) -> bool:
        return self._prefix_words is not None

    @property
    def layout(self) -> str:
        return str(self._metadata["layout"])

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
            f"NgramFilter({str(self.path)!r}, n={self.n}, num_ngrams={self.num_ngrams}, "
            f"num_bits={self.num_bits}, num_probes={self.num_probes}, "
            f"expected_fpr={self.expected_false_positive_rate:.3g})"
        )

    def close(self) -> None:
        """Drop the mapping (queries after this fail)."""
        for array in (self._words, self._prefix_words):
            mapping = getattr(array, "_mmap", None)
            if mapping is not None:
                # Another view (e.g. a torch tensor) may still use it; it then closes with it.
                with contextlib.suppress(BufferError):
                    mapping.close()
        self._words = np.empty(0, dtype=np.uint64)
        if self._prefix_words is not None:
            self._prefix_words = np.empty(0, dtype=np.uint64)

    def __enter__(self) -> NgramFilter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def write_filter(
    path: str | os.PathLike[str],
    words: np.ndarray,
    metadata: Mapping[str, Any],
    prefix_words: np.ndarray | None = None,
    prefix_num_probes: int = 0,
    num_prefixes: int = 0,
) -> Path:
    """Write words (and an optional prefix section) as a filter file, atomically."""
    arrays = [np.ascontiguousarray(words, dtype="<u8")]
    if prefix_words is not None:
        arrays.append(np.ascontiguousarray(prefix_words, dtype="<u8"))
    for array in arrays:
        if array.ndim != 1 or array.shape[0] == 0 or array.shape[0] % WORDS_PER_BLOCK:
            raise ValueError(
                f"bit words must be a 1-D array of whole 512-bit blocks, got {array.shape}"
            )
    prefix = None
    if prefix_words is not None:
        prefix = PrefixSection(
            arrays[1].shape[0] // WORDS_PER_BLOCK, prefix_num_probes, num_prefixes
        )
    with FilterFileWriter(path, arrays[0].shape[0] // WORDS_PER_BLOCK, metadata, prefix) as writer:
        writer.words[:] = arrays[0]
        if writer.prefix_words is not None:
            writer.prefix_words[:] = arrays[1]
    return writer.path


@dataclass(frozen=True)
class PrefixSection:
    """Shape of a filter file's prefix section (see the module docstring)."""

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
        prefix: shape of the optional prefix section (then :attr:`prefix_words` is writable).
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
        self._data_offset = _page_round(_PREAMBLE.size + len(self._metadata_bytes()))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(
            prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
        )
        os.close(handle)
        self._temporary = Path(name)
        num_words = num_blocks * WORDS_PER_BLOCK
        prefix_words = prefix.num_blocks * WORDS_PER_BLOCK if prefix else 0
        with open(self._temporary, "r+b") as out:
            out.truncate(self._data_offset + (num_words + prefix_words) * 8)
        self.words = np.memmap(
            self._temporary, dtype="<u8", mode="r+", offset=self._data_offset, shape=(num_words,)
        )
        self.prefix_words: np.memmap[Any, Any] | None = None
        if prefix is not None:
            self.prefix_words = np.memmap(
                self._temporary,
                dtype="<u8",
                mode="r+",
                offset=self._data_offset + num_words * 8,
                shape=(prefix_words,),
            )

    def _metadata_bytes(self) -> bytes:
        return json.dumps(self.metadata, sort_keys=True, separators=(",", ":")).encode("utf-8")

    def commit(self) -> Path:
        """Checksum the bits, write the header, fsync and rename into place."""
        self.words.flush()
        self.metadata["bits_xxh3"] = xxhash.xxh3_64_hexdigest(self.words.data.cast("B"))
        if self.prefix_words is not None:
            self.prefix_words.flush()
            self.metadata["prefix"]["bits_xxh3"] = xxhash.xxh3_64_hexdigest(
                self.prefix_words.data.cast("B")
            )
        raw = self._metadata_bytes()
        preamble = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(raw), xxhash.xxh3_64_intdigest(raw))
        header = preamble + raw
        if len(header) > self._data_offset:
            raise RuntimeError("filter header grew while writing")  # the checksum has fixed width
        header += b"\x00" * (self._data_offset - len(header))
        del self.words
        self.prefix_words = None
        with open(self._temporary, "r+b") as out:
            out.write(header)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(self._temporary, new_file_mode(self.path))
        os.replace(self._temporary, self.path)
        return self.path

    def abort(self) -> None:
        """Discard the temporary file."""
        self.__dict__.pop("words", None)
        self.prefix_words = None
        self._temporary.unlink(missing_ok=True)

    def __enter__(self) -> FilterFileWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def new_file_mode(path: Path) -> int:
    """Permission bits for a file about to replace ``path``: those of the file it replaces (a
    rebuild keeps what its owner chose), else what ``open()`` would give a new file under the
    process umask (a filter says what its corpus holds, so ``umask 077`` keeps it private)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~current_umask()


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (else set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic_write(path: Path, chunks: list[bytes | memoryview]) -> None:
    """Write chunks to a temporary file beside ``path``, fsync, then rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, new_file_mode(path))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def bits_from_fingerprints(
    fingerprints: np.ndarray, num_blocks: int, num_probes: int
) -> np.ndarray:
    """A blocked bit array holding the given fingerprints (uint64 `(num_blocks * 8,)`)."""
    words = np.zeros(num_blocks * WORDS_PER_BLOCK, dtype=np.uint64)
    set_fingerprint_bits(words, fingerprints, num_probes)
    return words


def set_fingerprint_bits(
    words: np.ndarray, fingerprints: np.ndarray, num_probes: int, chunk: int = 1 << 20
) -> None:
    """OR the probe bits of ``fingerprints`` into ``words`` in place, in bounded-memory chunks."""
    num_blocks = words.shape[0] // WORDS_PER_BLOCK
    fingerprints = np.asarray(fingerprints, dtype=np.uint64)
    for begin in range(0, fingerprints.shape[0], chunk):
        positions = probe_positions_np(fingerprints[begin : begin + chunk], num_blocks, num_probes)
        positions = positions.ravel()
        np.bitwise_or.at(
            words, positions >> 6, np.left_shift(np.uint64(1), (positions & 63).astype(np.uint64))
        )


def describe_rate(rate: float) -> str:
    """A false-positive rate as "1 in N" text."""
    if rate <= 0:
        return "0"
    return f"{rate:.3g} (1 in {math.ceil(1 / rate):,})"
