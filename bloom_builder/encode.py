"""The encode step: documents -> integer ids (token ids, or normalized-word hashes), in batches,
with the encoder each worker builds once from the unit's picklable payload (:mod:`memfree.units`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bloom_builder.segments import Document, split_long, take_batch
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit, read_unit
from memfree.units import Encoder, EncoderPayload

# The encoder of this worker process, built once by init_worker (a pool's initializer).
_ENCODER: Encoder | None = None


def init_worker(payload: EncoderPayload) -> None:
    """Worker setup: build the encoder once per worker process."""
    global _ENCODER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _ENCODER = payload.encoder()


def worker_encoder() -> Encoder:
    """The encoder :func:`init_worker` built in this process."""
    if _ENCODER is None:
        raise RuntimeError("init_worker() must run in this process before a map task")
    return _ENCODER


@dataclass
class EncodeSeconds:
    """Time spent reading documents and encoding them (added to by :func:`encoded_batches`)."""

    reading: float = 0.0
    encoding: float = 0.0


def encoded_batches(
    unit: WorkUnit,
    options: SourceOptions,
    problems: ProblemLog,
    encoder: Encoder,
    batch_documents: int,
    batch_bytes: int,
    seconds: EncodeSeconds | None = None,
) -> Iterator[list[tuple[Document, np.ndarray]]]:
    """The documents of one unit with their ids, batch by batch, in file order.

    Documents longer than a segment are cut first (``continues`` says which piece goes on), so
    no text beyond :data:`~bloom_builder.segments.SEGMENT_BYTES` is encoded at once.

    Args:
        unit: the work unit to read.
        options: how its documents are read.
        problems: receives what is skipped.
        encoder: turns texts into ids.
        batch_documents: most documents encoded at once.
        batch_bytes: most characters encoded at once beyond the first document.
        seconds: receives the time spent reading and encoding.

    Yields:
        Lists of ``(document, ids)``: ids an integer array `(num_ids,)` per document piece.
    """
    seconds = seconds if seconds is not None else EncodeSeconds()
    documents = split_long(_usable_ids(read_unit(unit, options, problems), encoder, problems))
    while True:
        started = time.perf_counter()
        batch = take_batch(documents, batch_documents, batch_bytes)
        seconds.reading += time.perf_counter() - started
        if not batch:
            return
        started = time.perf_counter()
        texts = [document.text for document in batch if document.ids is None]
        encoded = iter(encoder.encode(texts) if texts else [])
        ids = [
            next(encoded) if document.ids is None else document.ids.astype(np.uint32)
            for document in batch
        ]
        seconds.encoding += time.perf_counter() - started
        yield list(zip(batch, ids, strict=True))


def _usable_ids(
    documents: Iterator[Document], encoder: Encoder, problems: ProblemLog
) -> Iterator[Document]:
    """The documents, less pre-tokenized ones the encoder cannot take (recorded, with the file,
    the row and the first bad position): ids outside the tokenizer's vocabulary, or ids given
    to a unit that reads text. Checked whole, before any cut, so no n-gram spans a gap."""
    for document in documents:
        ids = document.ids
        if ids is None:
            yield document
            continue
        vocab = encoder.vocab_size
        if vocab is None:
            problems.record(
                "token ids",
                document.where,
                "pre-tokenized documents need --unit token (the word unit reads text)",
            )
            continue
        if ids.size and not _in_range(ids, vocab):
            position = int(np.flatnonzero((ids < 0) | (ids >= vocab))[0])
            problems.record(
                "ids out of range",
                document.where,
                f"id {int(ids[position])} at position {position} is outside the tokenizer's "
                f"vocabulary [0, {vocab}); give the tokenizer the ids belong to (--tokenizer)",
            )
            continue
        yield document


def _in_range(ids: np.ndarray, vocab: int) -> bool:
    """Whether every id of a non-empty array is in [0, vocab): a max (and a min for signed ids)
    rather than two comparisons, an or and a search per document."""
    return (ids.dtype.kind == "u" or ids.min() >= 0) and bool(ids.max() < vocab)
