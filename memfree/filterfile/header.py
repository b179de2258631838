"""The header memfree's layouts share: the preamble, written and read, and :class:`FilterHeader`,
every header parsed once into a typed value.

The preamble (all integers little-endian)::

    offset 0   8 bytes   magic b"MEMFREE\\0"
    offset 8   uint32    format version (1: the blocked Bloom layout; 2: the prefix index)
    offset 12  uint32    length L of the JSON metadata
    offset 16  uint64    xxh3-64 of the JSON metadata bytes
    offset 24  L bytes   UTF-8 JSON metadata (sorted keys), zero padding up to a multiple of 4096
    then                 the layout's own sections, page-aligned (so numpy.memmap and
                         torch.from_numpy map them without copying): the Bloom layout's bit
                         words (:mod:`memfree.filterfile.bloom`), the index's tables and records
                         (:mod:`memfree.filterfile.index`)

The metadata records everything that produced the file and checksums of what follows; the same
inputs give the same bytes (there is no wall-clock field). The metadata checksum only proves that
the header is the one that was written last, not that it is sane: an edited header with its
checksum recomputed must still never crash a reader, never make the guard miss a stored n-gram and
never yield a filter that silently blocks nothing. So each layout checks every field its readers
rely on before its header is parsed (:mod:`memfree.filterfile.bloom.header`,
:mod:`memfree.filterfile.index.header`), and binds the fields the guard relies on
(:data:`GUARD_FIELDS`) and its hashing parameters to its checksums.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

import xxhash

from memfree.errors import DamagedFilterError, FilterError

MAGIC = b"MEMFREE\x00"
FORMAT_VERSION = 1
#: The prefix-keyed index layout (:mod:`memfree.filterfile.index.reader`).
INDEX_FORMAT_VERSION = 2
PAGE_BYTES = 4096
# magic, format version, metadata length, xxh3-64 of the metadata bytes (little-endian)
PREAMBLE = struct.Struct("<8sIIQ")
MAX_METADATA_BYTES = 16 << 20
MAX_NGRAM_SIZE = 64
#: What the guard relies on besides where the bits are, bound in every layout's digest: a
#: deleted or edited tokenizer fingerprint would accept any tokenizer (and guard nothing), an
#: edited special-token list would exempt ids, an edited normalizer would read other words.
GUARD_FIELDS = (
    "tokenizer_fingerprint",
    "special_token_ids",
    "vocab_size",
    "normalizer",
    "unicode_version",
)


@dataclass(frozen=True, kw_only=True)
class FilterHeader:
    """What a filter file's header says, parsed once when the file is opened (after every field
    was checked: :func:`check_metadata`, the index's and pybloomfiltermmap3's own checks) and read
    by attribute. Each layout's reader has its own (:class:`BloomHeader`,
    :class:`~memfree.filterfile.index.IndexHeader`,
    :class:`~memfree.filterfile.pybloom.PybloomHeader`); :attr:`raw` is the JSON as read (what
    ``memfree info`` shows).

    Attributes:
        layout: the file's layout, as the header names it.
        n: units per stored n-gram.
        unit: ``"token"`` or ``"word"``: what the n-grams are made of.
        num_ngrams: the n-grams stored.
        expected_false_positive_rate: the rate the header states (recomputed from its sizes
            when it was checked).
        special_token_ids: the ids the builder cut at (no stored n-gram holds one), when
            recorded.
        tokenizer, tokenizer_fingerprint, vocab_size: the vocabulary a token filter was built
            with, when recorded.
        normalizer, unicode_version: a word filter's normalizer and the Unicode it ran with.
        raw: the header's JSON, read-only.
    """

    layout: str
    n: int
    unit: str
    num_ngrams: int
    expected_false_positive_rate: float
    special_token_ids: tuple[int, ...] | None = None
    tokenizer: str | None = None
    tokenizer_fingerprint: str | None = None
    vocab_size: int | None = None
    normalizer: str | None = None
    unicode_version: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles and copies (a guard's copy holds its filter's header): the raw view as a
        dict, made read-only again by :meth:`__setstate__`."""
        state = dict(self.__dict__)
        state["raw"] = dict(self.raw)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, MappingProxyType(value) if name == "raw" else value)

    @classmethod
    def of(cls, metadata: Mapping[str, Any], **fields: Any) -> Any:
        """The header of checked ``metadata``; ``fields``: the layout's own (its subclass's)."""
        ids = metadata.get("special_token_ids")
        vocab_size = metadata.get("vocab_size")
        return cls(
            layout=str(metadata["layout"]),
            n=int(metadata["n"]),
            unit=str(metadata.get("unit", "token")),
            num_ngrams=int(metadata["num_ngrams"]),
            expected_false_positive_rate=float(metadata["expected_false_positive_rate"]),
            special_token_ids=None if ids is None else tuple(int(i) for i in ids),
            tokenizer=_optional_str(metadata.get("tokenizer")),
            tokenizer_fingerprint=_optional_str(metadata.get("tokenizer_fingerprint")),
            vocab_size=None if vocab_size is None else int(vocab_size),
            normalizer=_optional_str(metadata.get("normalizer")),
            unicode_version=_optional_str(metadata.get("unicode_version")),
            raw=MappingProxyType(json.loads(json.dumps(dict(metadata)))),
            **fields,
        )


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def page_round(size_bytes: int) -> int:
    """``size_bytes`` rounded up to whole pages: where the bit words start after the header."""
    return (size_bytes + PAGE_BYTES - 1) // PAGE_BYTES * PAGE_BYTES


def damaged_error(path: Path, problem: str) -> DamagedFilterError:
    """The error for a native filter file that cannot be trusted, naming the file and the fix."""
    return DamagedFilterError(
        f"{path}: {problem}; the file is damaged or not a memfree filter, rebuild it with "
        "`memfree build`"
    )


def json_bytes(metadata: Mapping[str, Any]) -> bytes:
    """The header's JSON encoding: sorted keys, no spaces, UTF-8 (the same dict, the same bytes)."""
    return json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode("utf-8")


def header_bytes(metadata: Mapping[str, Any], version: int, length: int) -> bytes:
    """A memfree filter file's first ``length`` bytes (either layout): the preamble (magic, ``version``, the metadata's
    length and xxh3), the JSON metadata, zero padding.

    Raises:
        RuntimeError: the metadata outgrew ``length`` (writers size it with fixed-width
            placeholders, so this is a bug, never a user's mistake).
    """
    raw = json_bytes(metadata)
    header = PREAMBLE.pack(MAGIC, version, len(raw), xxhash.xxh3_64_intdigest(raw)) + raw
    if len(header) > length:
        raise RuntimeError("filter header grew while writing")
    return header + b"\x00" * (length - len(header))


def read_preamble(path: Path) -> bytes:
    """The first bytes of a would-be filter file (any format), with an error naming the fix."""
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise FilterError(f"{path}: is a directory, not a filter file")
        if not stat.S_ISREG(mode):
            raise FilterError(f"{path}: not a regular file (a device, socket or pipe)")
        with open(path, "rb") as handle:
            return handle.read(PREAMBLE.size)
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


def format_version(head: bytes) -> int | None:
    """The format version a native file's preamble states (None: too short to say)."""
    if len(head) < PREAMBLE.size:
        return None
    return int(PREAMBLE.unpack(head)[1])


def read_metadata(
    path: Path, head: bytes, file_size: int, handle: BinaryIO | None, version: int
) -> tuple[dict[str, Any], int]:
    """The preamble checked (magic, ``version``, metadata length and checksum) and the JSON
    metadata decoded, not yet validated field by field.

    Returns:
        (the metadata, the byte offset after the header's pages).

    Raises:
        DamagedFilterError: any problem, named.
    """
    if len(head) < PREAMBLE.size:
        raise damaged_error(
            path, f"only {len(head)} bytes, shorter than the {PREAMBLE.size}-byte preamble"
        )
    magic, found_version, metadata_bytes, metadata_hash = PREAMBLE.unpack(head)
    if magic != MAGIC:
        raise damaged_error(path, f"bad magic bytes {magic!r}")
    if found_version != version:
        raise DamagedFilterError(
            f"{path}: format version {found_version}, this memfree reads versions "
            f"{FORMAT_VERSION} and {INDEX_FORMAT_VERSION}; rebuild the filter or upgrade memfree"
        )
    if metadata_bytes > MAX_METADATA_BYTES or PREAMBLE.size + metadata_bytes > file_size:
        raise damaged_error(
            path, f"metadata length {metadata_bytes} does not fit in {file_size} bytes"
        )
    if handle is not None:
        raw = os.pread(handle.fileno(), metadata_bytes, PREAMBLE.size)
    else:
        with open(path, "rb") as reader:
            reader.seek(PREAMBLE.size)
            raw = reader.read(metadata_bytes)
    if xxhash.xxh3_64_intdigest(raw) != metadata_hash:
        raise damaged_error(path, "metadata checksum mismatch")
    try:
        metadata = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise damaged_error(path, f"unreadable metadata ({error})") from None
    if not isinstance(metadata, dict):
        raise damaged_error(path, "metadata is not a JSON object")
    return metadata, page_round(PREAMBLE.size + metadata_bytes)


__all__ = [
    "FORMAT_VERSION",
    "GUARD_FIELDS",
    "INDEX_FORMAT_VERSION",
    "MAGIC",
    "MAX_METADATA_BYTES",
    "MAX_NGRAM_SIZE",
    "PAGE_BYTES",
    "PREAMBLE",
    "FilterHeader",
    "damaged_error",
    "format_version",
    "header_bytes",
    "json_bytes",
    "page_round",
    "read_metadata",
    "read_preamble",
]
