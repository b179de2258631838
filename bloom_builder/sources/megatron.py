"""The Megatron indexed-dataset reader (``.bin`` + ``.idx``, the ``MMIDIDX`` format of Megatron-LM
and GPT-NeoX, in which Pythia's Pile is stored): pre-tokenized documents, a range per unit.

The ``.idx`` file holds, after a 34-byte header (magic ``MMIDIDX\\0\\0``, version 1, a dtype code,
the sequence and document counts), each sequence's length (int32) and byte offset in the
``.bin`` file (int64), then the document boundaries (int64 indices into the sequences, from 0 to
the sequence count). A document is the concatenation of its sequences.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bloom_builder.segments import Document
from bloom_builder.sources.units import ProblemLog, SourceOptions, WorkUnit, reason

MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQQ")
# Megatron-LM's DType codes; only integer types can hold token ids.
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
DOCUMENTS_PER_UNIT = 1 << 14


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


def read_index(idx_path: str, check_all: bool = True) -> MegatronIndex:
    """Read and check an ``.idx`` file and the size of its ``.bin``.

    The arrays are memory-mapped: a task reading a few documents of a Pile-sized index (hundreds
    of millions of documents, gigabytes of index) touches only their pages.

    Args:
        idx_path: the ``.idx`` file.
        check_all: check every sequence and boundary (discovery does, once); without it only the
            header and sizes are checked here, and a reader checks the range it reads.

    Raises:
        ValueError: the files are not a consistent Megatron indexed dataset (the reason named).
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
    need = _HEADER.size + num_sequences * 12 + num_documents * 8
    size = os.path.getsize(idx_path)
    if num_documents < 1 or size not in (need, need + num_sequences):  # + optional modes
        raise ValueError(f"{size:,} bytes where its counts need {need:,}: truncated or damaged")
    offset = _HEADER.size
    lengths = _map(idx_path, np.int32, num_sequences, offset)
    pointers = _map(idx_path, np.int64, num_sequences, offset + 4 * num_sequences)
    documents = _map(idx_path, np.int64, num_documents, offset + 12 * num_sequences)
    index = MegatronIndex(np.dtype(DTYPES[code]), lengths, pointers, documents)
    if check_all:
        _check_sequences(index, 0, num_sequences, os.path.getsize(bin_path(idx_path)))
        if documents[0] != 0 or documents[-1] != num_sequences or np.any(np.diff(documents) < 0):
            raise ValueError("document boundaries are not increasing from 0 to the sequence count")
    return index


def _map(path: str, dtype: type, count: int, offset: int) -> np.ndarray:
    """``count`` little-endian values of ``dtype`` at ``offset`` in ``path``, memory-mapped."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", offset=offset,
                     shape=(count,))  # fmt: skip


def _check_sequences(index: MegatronIndex, first: int, last: int, data_bytes: int) -> None:
    """Sequences ``first`` to ``last`` lie inside the ``.bin`` file (ValueError if not)."""
    if last <= first:
        return
    lengths = np.asarray(index.lengths[first:last])
    pointers = np.asarray(index.pointers[first:last])
    ends = pointers + lengths.astype(np.int64) * index.dtype.itemsize
    if lengths.min() < 0 or pointers.min() < 0 or ends.max() > data_bytes:
        raise ValueError(f"a sequence lies outside the {data_bytes:,}-byte .bin file")


def megatron_units(idx_path: str, problems: ProblemLog) -> list[WorkUnit]:
    """One work unit per :data:`DOCUMENTS_PER_UNIT` documents (none, recorded, if unusable)."""
    try:
        index = read_index(idx_path)
    except (OSError, ValueError) as error:
        problems.record("unreadable", idx_path, reason(error))
        return []
    total = index.num_documents
    token_bytes = index.lengths.astype(np.int64) * index.dtype.itemsize
    starts = np.concatenate([[0], np.cumsum(token_bytes)])
    units = []
    for first in range(0, total, DOCUMENTS_PER_UNIT):
        last = min(first + DOCUMENTS_PER_UNIT, total)
        size = int(starts[index.documents[last]] - starts[index.documents[first]])
        units.append(WorkUnit(idx_path, "megatron", "", first, last, size))
    return units


def read_megatron(
    unit: WorkUnit, options: SourceOptions, problems: ProblemLog
) -> Iterator[Document]:
    """The documents ``unit.start`` to ``unit.stop`` of a Megatron dataset, as token ids.

    Each document's sequences are read with ``os.pread`` rather than through a memory map of the
    ``.bin`` file, so a worker's resident memory is what it holds, not the pages it has read.
    """
    where = bin_path(unit.path)
    try:
        index = read_index(unit.path, check_all=False)
        stop = min(unit.stop, index.num_documents)
        boundaries = np.asarray(index.documents[unit.start : stop + 1])
        if boundaries.size and (
            np.any(np.diff(boundaries) < 0) or boundaries[-1] > len(index.lengths)
        ):
            raise ValueError("document boundaries are not increasing")
        if boundaries.size:
            _check_sequences(index, int(boundaries[0]), int(boundaries[-1]), os.path.getsize(where))
        handle = os.open(where, os.O_RDONLY)
    except (OSError, ValueError) as error:
        problems.record("unreadable", unit.path, reason(error))
        return
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
                np.frombuffer(os.pread(handle, length * itemsize, pointer), dtype=dtype)
                for pointer, length in zip(pointers[first:last], lengths[first:last], strict=True)
            ]
            ids = np.concatenate(pieces) if len(pieces) != 1 else pieces[0]
            if ids.size:
                yield Document("", ids=ids, where=f"{where}:document {document}")
            else:
                problems.record("empty", f"{where}:document {document}", "no token ids")
    finally:
        os.close(handle)


def write_megatron(prefix: str, documents: list[list[int]], dtype: type = np.uint16) -> None:
    """Write ``documents`` as ``prefix.bin`` + ``prefix.idx`` (one sequence per document), as
    Megatron-LM's ``IndexedDatasetBuilder`` does: for tests and for converting small corpora."""
    code = next(code for code, known in DTYPES.items() if np.dtype(known) == np.dtype(dtype))
    arrays: list[np.ndarray] = [np.asarray(document, dtype=dtype) for document in documents]
    with open(prefix + ".bin", "wb") as out:
        for array in arrays:
            out.write(array.tobytes())
    lengths = np.array([array.size for array in arrays], dtype=np.int32)
    pointers = (
        np.concatenate([[0], np.cumsum(lengths.astype(np.int64))[:-1]]) * np.dtype(dtype).itemsize
    )
    boundaries = np.arange(len(arrays) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as out:
        out.write(_HEADER.pack(MAGIC, 1, code, len(arrays), len(arrays) + 1))
        out.write(lengths.tobytes())
        out.write(pointers.astype(np.int64).tobytes())
        out.write(boundaries.tobytes())


__all__ = ["MegatronIndex", "megatron_units", "read_index", "read_megatron", "write_megatron"]
