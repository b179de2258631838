"""Opening a native filter file: header, bits and file watch taken from one open file and verified
before any query, and the check that tells a guard, once the file's identity changed, whether its
bytes did (:mod:`memfree.filterfile.filewatch`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from memfree.filterfile.bloom.bits import bits_checksum
from memfree.filterfile.bloom.header import (
    BloomHeader,
    check_hashing_binding,
    read_header,
    verify_bits,
)
from memfree.filterfile.filewatch import FileIdentity, FileWatch
from memfree.filterfile.header import PREAMBLE


@dataclass(frozen=True)
class OpenedFilter:
    """A native filter file, opened and validated: what :class:`~memfree.filterfile.bloom.reader.NgramFilter` holds
    (the arrays are mapped copy-on-write from the file ``file_watch`` keeps open)."""

    metadata: dict[str, Any]  # the validated header metadata
    bit_words: np.ndarray  # uint64 (num_bits / 64,), memory-mapped: never write
    prefix_bit_words: np.ndarray | None  # uint64 (prefix num_bits / 64,), None without a prefix
    file_watch: FileWatch


def open_native(path: Path, verify: bool) -> OpenedFilter:
    """Open, map and validate a memfree filter file.

    Args:
        path: the file (its first bytes already name the native format).
        verify: check the bit arrays against the header (reads the whole file once).

    Returns:
        The metadata, the mapped bit arrays and the watch over the open file.

    Raises:
        DamagedFilterError: the file is truncated, damaged, of another version or not a filter.
    """
    # One open file for the header, the bits and the watch: a rename over the path meanwhile
    # cannot mix two files, and the identity is taken before anything is read or verified.
    handle = open(path, "rb")  # noqa: SIM115 - kept open by the watch while the bits are mapped
    try:
        identity = FileIdentity.of(os.fstat(handle.fileno()))
        head = os.pread(handle.fileno(), PREAMBLE.size, 0)
        metadata, data_offset = read_header(path, head, identity.size_bytes, handle)
        header = os.pread(handle.fileno(), data_offset, 0)
        fields = BloomHeader.read(metadata)
        num_words = fields.num_bits // 64
        # mode "c": copy-on-write, so torch.from_numpy gets a writable view without a copy
        # while the file itself can never be changed through this mapping.
        bit_words = np.memmap(handle, dtype="<u8", mode="c", offset=data_offset, shape=(num_words,))
        prefix_bit_words = None
        if fields.prefix_num_bits:
            prefix_bit_words = np.memmap(
                handle,
                dtype="<u8",
                mode="c",
                offset=data_offset + num_words * 8,
                shape=(fields.prefix_num_bits // 64,),
            )
        if verify:
            verify_bits(path, metadata, bit_words, prefix_bit_words)
        else:  # the binding reads only the header: an edited seed or n never opens unverified
            check_hashing_binding(path, metadata)
    except BaseException:
        handle.close()
        raise
    intact = intact_check(handle, header, fields, bit_words, prefix_bit_words)
    return OpenedFilter(
        metadata, bit_words, prefix_bit_words, FileWatch(path, handle, identity, intact)
    )


def intact_check(
    handle: BinaryIO,
    header: bytes,
    fields: BloomHeader,
    bit_words: np.ndarray,
    prefix_bit_words: np.ndarray | None,
) -> Callable[[], str | None]:
    """What tells a guard, once the file's identity changed, whether its bytes did: the header's
    bytes as opened, and the bit arrays against the checksums it records. (It holds the arrays,
    not the filter, so that a filter is freed as soon as it is no longer used.)"""
    checksum = fields.bits_xxh3
    prefix_checksum = fields.prefix_bits_xxh3

    def problem() -> str | None:
        if os.pread(handle.fileno(), len(header), 0) != header:
            return "its header changed"
        if bits_checksum(bit_words) != checksum:
            return "its bit array changed"
        if prefix_bit_words is not None and bits_checksum(prefix_bit_words) != prefix_checksum:
            return "its prefix section changed"
        return None

    return problem


__all__ = ["OpenedFilter", "intact_check", "open_native"]
