"""The blocked Bloom layout's header: read and validated as a whole, and parsed into a
:class:`BloomHeader`.

After the shared preamble (:mod:`memfree.filterfile.header`, format version 1)::

    uint64    bit words, ``num_blocks * 8`` of them (page-aligned)
    uint64    optional prefix section: ``prefix.num_blocks * 8`` bit words of a second blocked
              Bloom filter holding the (n-1)-token prefixes of stored n-grams

Every field the readers rely on is checked (:mod:`.fields`), the false-positive rate the header
states is recomputed from its sizes, the file's size must be exactly what the header implies, and
(when the bits are verified) the share of set bits is compared with what the header's n-gram count
and probe count must produce (:mod:`.bits`). An edited seed or n shows in no bit, so the header
must also carry ``hashing_xxh3``, binding the bits' checksums to the parameters that placed them:
a header without it is refused (rebuild the file), as is one it does not match.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from memfree.filterfile.bloom.bits import binding_problem, bits_problem
from memfree.filterfile.bloom.fields import check_metadata
from memfree.filterfile.header import (
    FORMAT_VERSION,
    FilterHeader,
    damaged_error,
    read_metadata,
)


@dataclass(frozen=True, kw_only=True)
class BloomHeader(FilterHeader):
    """The blocked Bloom layout's header (:class:`FilterHeader`, and its bit arrays' sizes,
    probes and checksums).

    Attributes:
        hash_seed: the seed of the n-gram hash.
        num_bits, num_probes, bits_xxh3: the n-gram bit array's size, probes and checksum.
        prefix_num_bits, prefix_num_probes, prefix_bits_xxh3: the prefix section's (0, 0 and
            None when the file has none).
    """

    hash_seed: int
    num_bits: int
    num_probes: int
    bits_xxh3: str | None
    prefix_num_bits: int = 0
    prefix_num_probes: int = 0
    prefix_bits_xxh3: str | None = None

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> BloomHeader:
        """The header of metadata :func:`check_metadata` passed."""
        prefix = metadata.get("prefix") or {}
        header: BloomHeader = cls.of(
            metadata,
            hash_seed=int(metadata["hash_seed"]),
            num_bits=int(metadata["num_bits"]),
            num_probes=int(metadata["num_probes"]),
            bits_xxh3=_text(metadata.get("bits_xxh3")),
            prefix_num_bits=int(prefix.get("num_bits", 0)),
            prefix_num_probes=int(prefix.get("num_probes", 0)),
            prefix_bits_xxh3=_text(prefix.get("bits_xxh3")),
        )
        return header


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def read_header(
    path: Path, head: bytes, file_size: int, handle: BinaryIO | None = None
) -> tuple[dict[str, Any], int]:
    """Parse and validate a native filter file's header.

    Args:
        path: the file (read again for the metadata unless ``handle`` is given; named in errors).
        head: its first ``PREAMBLE.size`` bytes (fewer when the file is shorter).
        file_size: its size in bytes; must be exactly what the header implies.
        handle: the open file to read the metadata from (so that header and bits come from one
            file even if the path is renamed over meanwhile).

    Returns:
        (the validated JSON metadata, the byte offset of the first bit word).

    Raises:
        DamagedFilterError: any problem, named.
    """
    metadata, data_offset = read_metadata(path, head, file_size, handle, FORMAT_VERSION)
    problem = check_metadata(metadata)
    if problem:
        raise damaged_error(path, problem)
    prefix = metadata.get("prefix")
    num_words = int(metadata["num_bits"]) // 64 + (int(prefix["num_bits"]) // 64 if prefix else 0)
    expected_size = data_offset + num_words * 8
    if file_size != expected_size:
        raise damaged_error(
            path, f"size {file_size} bytes, expected {expected_size} from its header"
        )
    return metadata, data_offset


def verify_bits(
    path: Path, metadata: dict[str, Any], bit_words: np.ndarray, prefix_bit_words: np.ndarray | None
) -> None:
    """Check the bit arrays against the header: their checksums, then their share of set bits,
    then the hashing binding (see :func:`memfree.filterfile.bloom.bits.bits_problem`).

    Args:
        path: the file (named in errors).
        metadata: its validated header metadata.
        bit_words: uint64 `(num_bits / 64,)`, the n-gram bit array.
        prefix_bit_words: uint64 `(prefix num_bits / 64,)`, or None without a prefix section.

    Raises:
        DamagedFilterError: the first mismatch, named.
    """
    problem = bits_problem(metadata, bit_words, prefix_bit_words)
    if problem:
        raise damaged_error(path, problem)


def check_hashing_binding(path: Path, metadata: dict[str, Any]) -> None:
    """Refuse a header whose hashing parameters are not those its bits were written with (part of
    :func:`verify_bits`; run alone with ``verify=False``: it reads only the header, binding the
    bits' *recorded* checksums, so an edited seed, n or probe count never opens unverified).

    Raises:
        DamagedFilterError: ``hashing_xxh3`` is missing or does not match the header.
    """
    problem = binding_problem(metadata)
    if problem:
        raise damaged_error(path, problem)


__all__ = ["BloomHeader", "check_hashing_binding", "read_header", "verify_bits"]
