"""pybloomfiltermmap3 0.6's file layout and memfree's ``.json`` sidecar beside it: the header
parsed and checked, the sidecar's fields checked, and the checksums the sidecar records."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from memfree.filterfile.header import GUARD_FIELDS, MAX_NGRAM_SIZE, FilterHeader
from memfree.filterfile.pybloom.arithmetic import MAX_HASHES

MAGIC = b"MBITARRAY"
LAYOUT = "pybloomfiltermmap3"
HASH_SCHEME = "murmur3_x64_128-xor-mod"
KEY_ENCODING = "uint32le"
BF_VERSION = 1  # BF_CURRENT_VERSION in the library's bloomfilter.h
HEADER_BYTES = 1200  # sizeof(struct _BloomFilter) on 64-bit platforms
PREAMBLE_BYTES = 1280  # magic, uint64 num_bits, int32 header length, struct; rounded up to 256
FILE_PREFIX = struct.Struct("<9sQi")
# struct _BloomFilter: max_num_elem, error_rate, num_hashes, hash_seeds[256], pad, array pointer,
# bf_version, count_correct, pad, elem_count, reserved[32]
BLOOM_STRUCT = struct.Struct("<QdI256I4s8sBB6sQ128s")


@dataclass(frozen=True, kw_only=True)
class PybloomHeader(FilterHeader):
    """A pybloomfiltermmap3 file's header as memfree reads it: the library's file header and
    memfree's sidecar, checked (:class:`~memfree.filterfile.header.FilterHeader`, and the bit
    array's size and the library's hash seeds).

    Attributes:
        num_bits: the bit array's size.
        seeds: the library's hash seeds (one per probe).
    """

    num_bits: int
    seeds: tuple[int, ...]

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> PybloomHeader:
        """The header of checked fields (the sidecar's and the file header's)."""
        header: PybloomHeader = cls.of(
            metadata,
            num_bits=int(metadata["num_bits"]),
            seeds=tuple(int(seed) for seed in metadata["seeds"]),
        )
        return header


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where memfree keeps the JSON metadata of a pybloomfiltermmap3 file: ``<path>.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def parse_header(preamble: bytes, file_size: int) -> tuple[str | None, dict[str, Any]]:
    """The header's fields, and the first problem found (None for a sound header).

    Args:
        preamble: the file's first ``PREAMBLE_BYTES`` bytes.
        file_size: its size in bytes; must be exactly what the header implies.
    """
    magic, num_bits, header_len = FILE_PREFIX.unpack_from(preamble)
    if magic != MAGIC:
        return f"bad magic bytes {magic!r}, expected {MAGIC!r}", {}
    if header_len != HEADER_BYTES:
        return f"header length {header_len}, expected {HEADER_BYTES}", {}
    capacity, error_rate, num_hashes, *rest = BLOOM_STRUCT.unpack_from(preamble, FILE_PREFIX.size)
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
    elif any(pad + pad2 + reserved + preamble[FILE_PREFIX.size + HEADER_BYTES :]):
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


def read_sidecar(path: Path, damaged: Callable[[str], Exception]) -> dict[str, Any] | None:
    """The checked fields of ``path``'s sidecar, or None when it has none.

    Raises:
        ``damaged(problem)``: the sidecar is unreadable or a field it must hold is wrong.
    """
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
    if "bits_xxh3" in loaded and loaded.get("fields_xxh3") != fields_digest(loaded):
        raise damaged(
            f"sidecar {sidecar.name}: its n, checksums or the fields the guard relies on "
            "(tokenizer fingerprint, special tokens, normalizer) are not those memfree wrote: "
            "it was edited, or written by an earlier memfree (rebuild the filter with this "
            "version)"
        )
    return loaded


def fields_digest(sidecar: dict[str, Any]) -> str:
    """xxh3-64 binding a sidecar's checksums to n and the fields the guard relies on (tokenizer
    fingerprint, special tokens, normalizer): a sidecar edited to drop or change one of them,
    with its checksums kept, is refused. A sidecar written by hand (no checksums) binds nothing:
    the interchange format has no header of memfree's own to protect it."""
    bound = {
        key: sidecar.get(key)
        for key in ("n", "unit", "hash_seed", "bits_xxh3", "header_xxh3", *GUARD_FIELDS)
    }
    return xxhash.xxh3_64_hexdigest(json.dumps(bound, sort_keys=True).encode("utf-8"))


def xxh3_hex(data: bytes | np.ndarray) -> str:
    """The xxh3-64 hex digest the sidecar records for a header or a bit array."""
    return xxhash.xxh3_64_hexdigest(data.data if isinstance(data, np.ndarray) else data)


__all__ = [
    "BF_VERSION",
    "BLOOM_STRUCT",
    "FILE_PREFIX",
    "HASH_SCHEME",
    "HEADER_BYTES",
    "KEY_ENCODING",
    "LAYOUT",
    "MAGIC",
    "PREAMBLE_BYTES",
    "fields_digest",
    "parse_header",
    "read_sidecar",
    "sidecar_path",
    "xxh3_hex",
]
