"""The encode step: documents -> integer ids (token ids, or normalized-word hashes), in batches,
with the encoder each worker builds once from the unit's picklable payload (:mod:`memfree.units`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from bloom_builder.segments import Document, SpansEncoder, split_long, take_batch
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
    no text beyond :data:`~bloom_builder.segments.SEGMENT_BYTES` is encoded at once; with a
    tokenizer that gives character offsets, a long document is tokenized there, in overlapping
    windows spliced where they agree, to exactly the ids of its whole text
    (:func:`~bloom_builder.segments.split_long`).

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
    spans = spans_encoder(encoder)
    timed = None if spans is None else _timed(spans, seconds)
    usable = _usable_ids(read_unit(unit, options, problems), encoder, problems)
    documents = split_long(usable, encode=timed)
    while True:
        started, encoding = time.perf_counter(), seconds.encoding
        batch = take_batch(documents, batch_documents, batch_bytes)
        # what split_long spent tokenizing long documents is encoding time, not reading time
        seconds.reading += time.perf_counter() - started - (seconds.encoding - encoding)
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


def spans_encoder(encoder: Encoder) -> SpansEncoder | None:
    """How to tokenize one text with each token's character offsets, when ``encoder`` can: a
    Hugging Face fast tokenizer's ``tokenizers`` backend (kept by
    :class:`~memfree.units.BatchEncoder`; an encoder may also offer its own ``encode_spans``).
    None for the word unit and for tokenizers without a backend, whose long texts are cut."""
    own = getattr(encoder, "encode_spans", None)
    if callable(own):
        return own
    backend = getattr(encoder, "_backend", None)
    if backend is None or not callable(getattr(backend, "encode", None)):
        return None

    def encode(text: str) -> BackendSpans:
        return BackendSpans(backend.encode(text, add_special_tokens=False))

    return encode


class BackendSpans:
    """A ``tokenizers.Encoding`` as :class:`~bloom_builder.segments.Spans`: its ids, and each
    token's offsets and word read on demand (a window of 256 KiB has some 100,000 tokens; a
    splice reads a few thousand: all of them would cost a fifth of the tokenization)."""

    def __init__(self, encoding: Any) -> None:
        self._encoding = encoding
        self.ids = np.asarray(encoding.ids, dtype=np.uint32)

    def offsets(self, first: int, stop: int) -> np.ndarray:
        """int64 `(stop - first, 2)`: the [start, end) characters of tokens first..stop-1 (a
        token of no place in the text, which no encoding of one text without special tokens
        has, is given an empty one where the token before it ends)."""
        spans = []
        end = 0 if first == 0 else self._encoding.token_to_chars(first - 1)[1]
        for index in range(first, stop):
            found = self._encoding.token_to_chars(index) or (end, end)
            spans.append(found)
            end = found[1]
        return np.asarray(spans, dtype=np.int64).reshape(-1, 2)

    def words(self, first: int, stop: int) -> np.ndarray | None:
        """int64 `(stop - first,)`: the pre-token of each token (-1: none)."""
        words = (self._encoding.token_to_word(index) for index in range(first, stop))
        return np.fromiter((-1 if word is None else word for word in words), np.int64)


def _timed(encode: SpansEncoder, seconds: EncodeSeconds) -> SpansEncoder:
    """``encode``, its time added to ``seconds.encoding``."""

    def timed(text: str) -> Any:
        started = time.perf_counter()
        try:
            return encode(text)
        finally:
            seconds.encoding += time.perf_counter() - started

    return timed


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
