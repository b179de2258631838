"""Cutting long documents into segments, and batching documents by size, so that tokenization
stays within the build's memory budget however long a line or a document is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

# Fixed, so that the same corpus gives the same token ids (and filter bytes) whatever the
# memory limit or number of workers; its tokenization costs a bounded ~40 MB at most.
SEGMENT_BYTES = 256 << 10
# Measured bytes of tokenizer working memory per byte of text tokenized in one batch (80-150
# for SmolLM2's tokenizer on code; rounded up).
TOKENIZE_BYTES_PER_BYTE = 128
# How far back from the limit to look for a neutral cut before settling for any newline.
_NEUTRAL_WINDOW = 64 << 10

_NEUTRAL_TEXT = re.compile(r"(?<=\S)\n(?=\S)")
_NEUTRAL_BYTES = re.compile(rb"(?<=[^\s])\n(?=[^\s])")

AnyStr = TypeVar("AnyStr", str, bytes)


@dataclass(frozen=True)
class Document:
    """One document: its text, or its token ids when the corpus is pre-tokenized.

    Attributes:
        text: the text ("" for a pre-tokenized document).
        continues: the next Document yielded goes on with this one.
        ids: int64 `(num_ids,)` token ids of a pre-tokenized document (None: encode ``text``).
        where: the file and row (or document) it comes from, to name it in problems.
    """

    text: str
    continues: bool = False
    ids: np.ndarray | None = field(default=None, compare=False)
    where: str = ""

    @property
    def size(self) -> int:
        """Characters of text, or token ids: what encoding it costs."""
        return len(self.text) if self.ids is None else int(self.ids.shape[0])


def cut_point(text: AnyStr, limit: int) -> int:
    """Where to end a segment of at most ``limit`` units of ``text`` (which is longer).

    Returns the index after a newline between two non-space characters if one lies in the last
    64 KiB before ``limit``; else after the last newline, else after the last space or tab; else
    ``limit`` itself (for bytes, moved back to a UTF-8 character boundary).
    """
    low = max(0, limit - _NEUTRAL_WINDOW)
    window = text[low : limit + 1]  # one past the limit: the lookahead may read it
    pattern = _NEUTRAL_BYTES if isinstance(text, bytes) else _NEUTRAL_TEXT
    last = None
    for last in pattern.finditer(window):  # noqa: B007
        pass
    if last is not None and low + last.end() <= limit:
        return low + last.end()
    newline_char, space_char, tab_char = (
        (b"\n", b" ", b"\t") if isinstance(text, bytes) else ("\n", " ", "\t")
    )
    newline = text.rfind(newline_char, 0, limit)
    if newline >= 0:
        return newline + 1
    space = max(text.rfind(space_char, 0, limit), text.rfind(tab_char, 0, limit))
    if space >= 0:
        return space + 1
    cut = limit
    if isinstance(text, bytes):
        while cut > limit - 3 and (text[cut] & 0xC0) == 0x80:  # a UTF-8 continuation byte
            cut -= 1
    return cut


def split_long(documents: Iterator[Document], limit: int = SEGMENT_BYTES) -> Iterator[Document]:
    """The same documents, each longer than ``limit`` characters cut into continued segments.

    A tokenizer's working memory grows with the text it is given at once (about 80-150 bytes
    per input byte measured for SmolLM2's: a 41 MB single-line file tokenized whole peaked at
    2.8 GB), so no text longer than :data:`SEGMENT_BYTES` is ever tokenized at once, and a batch
    holds at most the bytes the worker's share of ``--memory-limit`` allows. Segments are
    continued across the cut (the last n-1 tokens carry over), and cuts are placed where they
    change no token for byte-level BPE tokenizers: at a newline between two non-space characters
    (the pre-tokenizer splits there anyway). Only a text with no such point in a whole segment (a
    single huge line) is cut elsewhere: at a newline, else a space, else a character boundary.
    """
    for document in documents:
        if document.ids is not None:
            yield from _split_ids(document, limit)
            continue
        text = document.text
        start = 0
        while len(text) - start > limit:
            cut = start + cut_point(text[start : start + limit + 1], limit)
            yield Document(text[start:cut], continues=True)
            start = cut
        yield document if start == 0 else Document(text[start:], document.continues)


def _split_ids(document: Document, limit: int) -> Iterator[Document]:
    """A pre-tokenized document cut every ``limit`` ids (pieces continue: n-grams carry over)."""
    ids = document.ids
    assert ids is not None
    if ids.shape[0] <= limit:
        yield document
        return
    for start in range(0, ids.shape[0], limit):
        last = start + limit >= ids.shape[0]
        piece = ids[start : start + limit]
        yield Document("", document.continues if last else True, piece, document.where)


def take_batch(documents: Iterator[Document], max_documents: int, max_bytes: int) -> list[Document]:
    """The next documents, at most ``max_documents`` of them and, beyond the first, at most
    ``max_bytes`` characters in all (characters: the bytes of ASCII text, a bound for the rest's
    tokenization cost)."""
    batch: list[Document] = []
    size = 0
    for document in documents:
        batch.append(document)
        size += document.size
        if len(batch) >= max_documents or size >= max_bytes:
            break
    return batch


def batch_bytes_for(memory_share_bytes: int) -> int:
    """Text per tokenization batch for a worker allowed ``memory_share_bytes`` for tokenizing."""
    return max(SEGMENT_BYTES, memory_share_bytes // TOKENIZE_BYTES_PER_BYTE)
