"""The Megatron indexed-dataset reader (``.bin`` + ``.idx``, the ``MMIDIDX`` format of Megatron-LM
and GPT-NeoX, in which Pythia's Pile is stored): pre-tokenized documents, a range per unit.

The ``.idx`` file holds, after a 34-byte header (magic ``MMIDIDX\\0\\0``, version 1, a dtype code,
the sequence and document counts), each sequence's length (int32) and byte offset in the
``.bin`` file (int64), then the document boundaries (int64 indices into the sequences, from 0 to
the sequence count). A document is the concatenation of its sequences.
"""

from __future__ import annotations

import errno
import functools
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from bloom_builder.segments import Document
from bloom_builder.sources.work_units import ProblemLog, SourceOptions, WorkUnit, reason
from memfree.errors import StorageError
from memfree.storage import (
    fetched,
    is_store_failure,
    is_url,
    open_url,
    refuse_changed,
    stamp,
    store_error,
)

MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQQ")
# Megatron-LM's DType codes; only integer types can hold token ids.
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
DOCUMENTS_PER_UNIT = 1 << 14
CHECK_SEQUENCES = 1 << 20  # sequences checked at once: bounds the memory a Pile-sized check takes


def bin_path(idx_path: str) -> str:
    """The ``.bin`` file beside an ``.idx`` file."""
    return idx_path[: -len(".idx")] + ".bin"


@dataclass(frozen=True)
class MegatronIndex:
    """An ``.idx`` file, validated against its ``.bin``.

    Attributes:
        dtype: the token ids' type in the ``.bin`` file.
        lengths: int32 `(num_sequences,)` token counts.
        pointers: int64 `(num_sequences,)` byte offsets in the ``.bin`` file.
        documents: int64 `(num_documents + 1,)` sequence index where each document starts.
    """

    dtype: np.dtype
    lengths: np.ndarray
    pointers: np.ndarray
    documents: np.ndarray

    @property
    def num_documents(self) -> int:
        return int(self.documents.shape[0]) - 1


def read_index(
    idx_path: str, check_all: bool = True, data_bytes: int | None = None
) -> MegatronIndex:
    """Read and check an ``.idx`` file and the size of its ``.bin``.

    The arrays are memory-mapped: a task reading a few documents of a Pile-sized index (hundreds
    of millions of documents, gigabytes of index) touches only their pages.

    Args:
        idx_path: the ``.idx`` file.
        check_all: check every sequence and boundary (discovery does, once): each sequence lies
            inside the ``.bin``, right after the one before (as Megatron writes them, so the
            pointers agree with the dtype's size), and the last ends where the ``.bin`` does;
            without it only the header and sizes are checked here, and a reader checks the
            range it reads.
        data_bytes: the ``.bin`` file's size (default: asked of the file beside ``idx_path``;
            given for a dataset on object storage, whose index is read from a local copy).

    Raises:
        ValueError: the files are not a consistent Megatron indexed dataset (the reason named;
            "damaged .idx: ..." where the index disagrees with itself or its ``.bin``).
        OSError: a file cannot be read.
    """
    with open(idx_path, "rb") as handle:
        head = handle.read(_HEADER.size)
    if len(head) < _HEADER.size or head[:9] != MAGIC:
        raise ValueError("not a Megatron index (no MMIDIDX header)")
    _, version, code, num_sequences, num_documents = _HEADER.unpack(head)
    if version != 1:
        raise ValueError(f"index version {version}; this reader knows version 1")
    if code not in DTYPES:
        raise ValueError(f"dtype code {code} holds no token ids (integer codes: {sorted(DTYPES)})")
    if num_documents < 1:
        raise ValueError("damaged .idx: no document boundaries (an index holds at least one, 0)")
    need = _HEADER.size + num_sequences * 12 + num_documents * 8
    size = os.path.getsize(idx_path)
    if size not in (need, need + num_sequences):  # + optional modes
        raise ValueError(
            f"damaged .idx: {size:,} bytes where its counts need {need:,} (truncated or damaged)"
        )
    offset = _HEADER.size
    lengths = _map(idx_path, np.int32, num_sequences, offset)
    pointers = _map(idx_path, np.int64, num_sequences, offset + 4 * num_sequences)
    documents = _map(idx_path, np.int64, num_documents, offset + 12 * num_sequences)
    index = MegatronIndex(np.dtype(DTYPES[code]), lengths, pointers, documents)
    if check_all:
        if data_bytes is None:
            data_bytes = os.path.getsize(bin_path(idx_path))
        _check_sequences(index, 0, num_sequences, data_bytes, whole=True)
        if documents[0] != 0 or documents[-1] != num_sequences or np.any(np.diff(documents) < 0):
            raise ValueError(
                "damaged .idx: document boundaries are not increasing from 0 to the sequence count"
            )
    return index


def is_megatron_index(path: str) -> bool:
    """Whether ``path`` begins with the ``MMIDIDX`` magic (unreadable files: False)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _map(path: str, dtype: type, count: int, offset: int) -> np.ndarray:
    """``count`` little-endian values of ``dtype`` at ``offset`` in ``path``, memory-mapped."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", offset=offset,
                     shape=(count,))  # fmt: skip


def _dtype_words(dtype: np.dtype) -> str:
    """E.g. "its dtype code 8 (2-byte uint16)", for messages blaming the dtype."""
    code = next(code for code, known in DTYPES.items() if np.dtype(known) == dtype)
    return f"its dtype code {code} ({dtype.itemsize}-byte {dtype.name})"


def _check_sequences(
    index: MegatronIndex, first: int, last: int, data_bytes: int, whole: bool = False
) -> None:
    """Sequences ``first`` to ``last`` lie inside the ``.bin`` file, each right after the one
    before; with ``whole`` (all of them), the first at byte 0 and the last ending at the end.

    Megatron-LM and GPT-NeoX write the sequences back to back, so a pointer is the sum of the
    lengths before it times the dtype's size: a dtype code that disagrees with the data fails
    here instead of turning the data into wrong ids. Sums are formed as pointer <= size - bytes
    (both far below 2**63), so no damaged pointer can wrap int64 past the check.

    Raises:
        ValueError: "damaged .idx: ..." naming the sequence and the check that failed.
    """
    itemsize = index.dtype.itemsize
    expected = 0 if whole else None  # where the next sequence must start, once known
    for low in range(first, last, CHECK_SEQUENCES):
        high = min(low + CHECK_SEQUENCES, last)
        lengths = np.asarray(index.lengths[low:high]).astype(np.int64)
        pointers = np.asarray(index.pointers[low:high]).astype(np.int64)
        sizes = lengths * itemsize  # |length| < 2**31: no overflow
        outside = (lengths < 0) | (pointers < 0) | (pointers > data_bytes - sizes)
        if outside.any():
            at = int(np.flatnonzero(outside)[0])
            raise ValueError(
                f"damaged .idx: sequence {low + at} ({int(lengths[at]):,} ids of {itemsize} "
                f"bytes at byte {int(pointers[at]):,}) lies outside the {data_bytes:,}-byte .bin "
                f"file: a damaged pointer or length, or {_dtype_words(index.dtype)} does not "
                "match the data"
            )
        ends = pointers + sizes  # inside the file now: no overflow
        # Where each sequence must start; a range's first sequence may start anywhere.
        previous = np.concatenate([[pointers[0] if expected is None else expected], ends[:-1]])
        moved = np.flatnonzero(pointers != previous)
        if moved.size:
            at = int(moved[0])
            raise ValueError(
                f"damaged .idx: sequence {low + at} starts at byte {int(pointers[at]):,}, not at "
                f"byte {int(previous[at]):,} where the sequences before it end (Megatron writes "
                f"them back to back): {_dtype_words(index.dtype)} does not match the data, or a "
                "pointer is damaged"
            )
        expected = int(ends[-1])
    end = expected if expected is not None else 0
    if whole and end != data_bytes:
        raise ValueError(
            f"damaged .idx: its sequences end at byte {end:,}, but the .bin file holds "
            f"{data_bytes:,} bytes: {_dtype_words(index.dtype)} does not match the data, or the "
            ".bin is not this index's"
        )


def megatron_units(idx_path: str, problems: ProblemLog) -> list[WorkUnit]:
    """One work unit per :data:`DOCUMENTS_PER_UNIT` documents (none, recorded, if unusable)."""
    try:
        data_bytes = _data_bytes(bin_path(idx_path))
        index = read_index(_local_index(idx_path), data_bytes=data_bytes)
    except StorageError:
        raise  # the store failed: not an answer about the dataset
    except (OSError, ValueError) as error:
        problems.record("unreadable", idx_path, _described(error))
        return []
    total = index.num_documents
    if total == 0:
        problems.record("empty", idx_path, "a Megatron dataset with no documents")
        return []

    def offset(sequence: int) -> int:  # checked: sequences lie back to back, filling the .bin
        return data_bytes if sequence == len(index.pointers) else int(index.pointers[sequence])

    units = []
    for first in range(0, total, DOCUMENTS_PER_UNIT):
        last = min(first + DOCUMENTS_PER_UNIT, total)
        size = offset(int(index.documents[last])) - offset(int(index.documents[first]))
        units.append(WorkUnit(idx_path, "megatron", "", first, last, size))
    return units


def _described(error: OSError | ValueError) -> str:
    """A problem's reason: a ValueError here is this module's own message, said as it is."""
    return str(error) if isinstance(error, ValueError) else reason(error)


def read_megatron(
    unit: WorkUnit, options: SourceOptions, problems: ProblemLog
) -> Iterator[Document]:
    """The documents ``unit.start`` to ``unit.stop`` of a Megatron dataset, as token ids.

    Each document's sequences are read with ``os.pread`` rather than through a memory map of the
    ``.bin`` file, so a worker's resident memory is what it holds, not the pages it has read. On
    object storage the ``.idx`` is read from its copy in memfree's cache (downloaded once per
    machine) and the ``.bin`` with ranged requests.
    """
    where = bin_path(unit.path)
    remote = is_url(where)
    # On a store: the .idx's stamp then the .bin's, as the build listed them (a dataset
    # rewritten since is refused, not read half old, half new).
    listed = unit.stamp if remote and len(unit.stamp) == 6 else ()
    try:
        if listed:
            refuse_changed(unit.path, listed[:3])
            refuse_changed(where, listed[3:])
        index = read_index(_local_index(unit.path), check_all=False)
        stop = min(unit.stop, index.num_documents)
        boundaries = np.asarray(index.documents[unit.start : stop + 1])
        if boundaries.size and (
            boundaries[0] < 0
            or np.any(np.diff(boundaries) < 0)
            or boundaries[-1] > len(index.lengths)
        ):
            raise ValueError("damaged .idx: document boundaries are not increasing")
        if boundaries.size:  # the .bin's size: as listed (checked above), else asked
            size = int(listed[3]) if listed else _data_bytes(where)
            _check_sequences(index, int(boundaries[0]), int(boundaries[-1]), size)
        handle: Any = open_url(where, listed[3:]) if remote else os.open(where, os.O_RDONLY)
    except StorageError:
        raise  # the store failed: not an answer about the dataset
    except (OSError, ValueError) as error:
        problems.record("unreadable", unit.path, _described(error))
        return
    read_at = _remote_reader(handle, where) if remote else functools.partial(os.pread, handle)
    try:
        itemsize = index.dtype.itemsize
        dtype = index.dtype.newbyteorder("<")
        # The unit's slices of the index as plain lists: one read, not a memmap access per value.
        base = int(boundaries[0]) if boundaries.size else 0
        end = int(boundaries[-1]) if boundaries.size else 0
        pointers = np.asarray(index.pointers[base:end]).tolist()
        lengths = np.asarray(index.lengths[base:end]).tolist()
        bounds = boundaries.tolist()
        for offset, document in enumerate(range(unit.start, stop)):
            first, last = bounds[offset] - base, bounds[offset + 1] - base
            pieces = [
                np.frombuffer(read_at(length * itemsize, pointer), dtype=dtype)
                for pointer, length in zip(pointers[first:last], lengths[first:last], strict=True)
            ]
            ids = np.concatenate(pieces) if len(pieces) != 1 else pieces[0]
            if ids.size:
                yield Document("", ids=ids, where=f"{where}:document {document}")
            else:
                problems.record("empty", f"{where}:document {document}", "no token ids")
    finally:
        if remote:
            handle.close()
        else:
            os.close(handle)


def _local_index(idx_path: str) -> str:
    """The ``.idx`` file to map: the path itself, or a dataset's on object storage copied into
    memfree's cache (once per machine, again when the object changes)."""
    return str(fetched(idx_path, "the Megatron index")) if is_url(idx_path) else idx_path


def _data_bytes(path: str) -> int:
    """The ``.bin`` file's size, on disk or on object storage."""
    if not is_url(path):
        return os.path.getsize(path)
    size, tag, modified = stamp(path)
    if not size and not tag and not modified:
        raise FileNotFoundError(errno.ENOENT, f"{path}: no such object")
    return int(size)


def _remote_reader(handle: Any, url: str) -> Callable[[int, int], bytes]:
    """``os.pread``'s arguments over an object: ranged reads, a store's failure named."""

    def read_at(size: int, offset: int) -> bytes:
        try:
            handle.seek(offset)
            data: bytes = handle.read(size)
        except Exception as error:
            if is_store_failure(error):
                raise store_error(url, "reading it", error) from None
            raise
        return data

    return read_at


def write_megatron(prefix: str, documents: list[list[int]], dtype: type = np.uint16) -> None:
    """Write ``documents`` as ``prefix.bin`` + ``prefix.idx`` (one sequence per document), as
    Megatron-LM's ``IndexedDatasetBuilder`` does: for tests and for converting small corpora."""
    code = next(code for code, known in DTYPES.items() if np.dtype(known) == np.dtype(dtype))
    arrays: list[np.ndarray] = [np.asarray(document, dtype=dtype) for document in documents]
    with open(prefix + ".bin", "wb") as out:
        for array in arrays:
            out.write(array.tobytes())
    lengths = np.array([array.size for array in arrays], dtype=np.int32)
    pointers = (np.cumsum(lengths, dtype=np.int64) - lengths) * np.dtype(dtype).itemsize
    boundaries = np.arange(len(arrays) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as out:
        out.write(_HEADER.pack(MAGIC, 1, code, len(arrays), len(arrays) + 1))
        out.write(lengths.tobytes())
        out.write(pointers.astype(np.int64).tobytes())
        out.write(boundaries.tobytes())


__all__ = [
    "MegatronIndex",
    "is_megatron_index",
    "megatron_units",
    "read_index",
    "read_megatron",
    "write_megatron",
]
