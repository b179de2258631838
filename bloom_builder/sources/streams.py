"""Compressed wrappers: a work unit's bytes as one stream, whether plain, gzip or zstd.

Damage (a corrupt or truncated stream, an I/O error) is recorded in the problem log, not raised.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import zlib
from collections.abc import Iterator
from typing import Any

from bloom_builder.sources.remote import is_store_failure, is_url, open_url, store_error
from bloom_builder.sources.work_units import ProblemLog, WorkUnit, reason
from memfree.errors import StorageError, require

# File name endings that say how a file is compressed.
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
COMPRESSION_RATIO = 4  # typical for text; sizes only balance shards


@contextlib.contextmanager
def opened(unit: WorkUnit, problems: ProblemLog) -> Iterator[io.BufferedIOBase | None]:
    """The unit's decompressed byte stream at byte max(start - 1, 0); None (recorded) on error."""
    try:
        raw = open_url(unit.path, unit.stamp) if is_url(unit.path) else open(unit.path, "rb")  # noqa: SIM115
        raw.seek(max(unit.start - 1, 0) if unit.kind == "jsonl" else 0)
        if unit.compression == "gzip":
            stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb")
        elif unit.compression == "zstd":
            stream = io.BufferedReader(ZstdReader(raw), buffer_size=1 << 20)
        else:
            stream = raw
    except Exception as error:
        if is_url(unit.path) and is_store_failure(error):
            raise store_error(unit.path, "opening it", error) from None
        if isinstance(error, StorageError) or not isinstance(error, OSError):
            raise  # a store that failed, or an object rewritten since the build listed it
        problems.record("unreadable", unit.path, reason(error))
        yield None
        return
    with raw, stream:
        yield stream


def read_bytes(
    stream: io.BufferedIOBase, size: int, unit: WorkUnit, problems: ProblemLog
) -> bytes | None:
    """``size`` bytes (a line for -1) of ``stream``; None, recorded, if the stream is damaged."""
    try:
        return stream.readline() if size < 0 else stream.read(size)
    except Exception as error:
        if is_url(unit.path) and is_store_failure(error) and not isinstance(error, EOFError):
            raise store_error(unit.path, "reading it", error) from None
        if not isinstance(error, (OSError, EOFError, zlib.error)):
            raise
        problems.record("unreadable", unit.path, reason(error))
        return None


class ZstdReader(io.RawIOBase):
    """All frames of a zstd stream, failing with OSError where data is corrupt and EOFError where
    the last frame is cut short (zstandard's own stream reader ends quietly there)."""

    def __init__(self, raw: io.BufferedIOBase) -> None:
        require("zstandard", "sources")
        import zstandard

        super().__init__()
        self._error = zstandard.ZstdError
        self._raw, self._decompressor = raw, zstandard.ZstdDecompressor()
        self._frame: Any = None  # decompressor of the frame being read; None between frames
        self._output, self._taken = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._taken >= len(self._output):
            compressed, pieces = self._raw.read(1 << 16), []
            if not compressed and self._frame is not None:
                raise EOFError("the zstd stream ends inside a frame: the file is truncated")
            if not compressed:
                return 0
            while compressed:
                self._frame = self._frame or self._decompressor.decompressobj()
                try:
                    pieces.append(self._frame.decompress(compressed))
                except self._error as error:
                    raise OSError(f"corrupt zstd data: {error}") from error
                if not self._frame.eof:
                    break
                compressed, self._frame = self._frame.unused_data, None
            self._output, self._taken = b"".join(pieces), 0
        size = min(len(buffer), len(self._output) - self._taken)
        memoryview(buffer).cast("B")[:size] = self._output[self._taken : self._taken + size]
        self._taken += size
        return size
