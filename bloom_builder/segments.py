"""Cutting long documents into segments, and batching documents by size, so that tokenization
stays within the build's memory budget however long a line or a document is.

A long document (a text longer than :data:`SEGMENT_BYTES` characters, or a text file that the
reader hands over in continued segments) still gets exactly the ids of
``tokenizer(text, add_special_tokens=False)`` on its whole text, so its n-grams are the real
tokenization's. No cut is neutral for every tokenizer: a cut after a space turns ``" word"`` into
``" "``, ``"word"`` in byte-level BPE; a whitespace run split by ``\\s+(?!\\S)`` depends on the
character after it; a SentencePiece-style normalizer prepends "▁" to every text it is given. So
the document is tokenized in overlapping *windows* of at most :data:`SEGMENT_BYTES` characters
each, with every token's character offsets, and consecutive windows are spliced where they agree.

The splice. Window A is ``text[a:e]``, the next window B is ``text[b:f]``, ``a < b < e < f``. A
point ``p`` of their overlap is a *splice point* when:

1. A and B hold the same tokens (ids and character offsets, in one aligned run, nothing between
   them left out or added) over at least ``margin`` characters on each side of ``p``, and a
   token of both starts at ``p``;
2. ``text[p : p + margin]`` holds a character that is not whitespace;
3. where the encoder reports pre-tokens (words) and A holds more than one: ``p`` is a boundary
   between two pre-tokens in A and in B.

Of the splice points after the previous one, the one nearest the middle of the overlap is taken
(ties: the earlier); the ids are A's before ``p`` and B's from ``p`` on. The overlap starts at
1/32 of a window; without a splice point it grows 4-fold (B starts earlier; a window never
grows) up to half a window, then settles for ``margin`` 1. Without one even then (a pre-token
longer than that, such as a run of 100,000 spaces), the document is cut before one of A's tokens
near the middle of that overlap, one that begins a pre-token followed by a character that is not
whitespace where there is one (then exact for pre-tokenizers without a start effect, by the
argument below), and tokenized on from there: the one inexact case, bounded like the others.

Why the splice is exact, for a tokenizer made of a normalizer that acts on each character and its
neighbours (NFC, lowercasing, ``Replace``) or only at the text's start (``Prepend``, Metaspace's
``prepend_scheme``), a pre-tokenizer that splits by patterns scanned left to right with no
look-behind, and a model that tokenizes each pre-token on its own (byte-level BPE such as
SmolLM2's, GPT-2's, Llama 3's or Qwen 2's split patterns, Metaspace, BERT's WordPiece):

* A scan of split patterns that has a boundary at ``p`` goes on from ``p`` as any scan of the
  same text after ``p`` does, whatever came before ``p`` (there is no look-behind): B, which
  starts at ``b``, splits the text after ``p`` as the whole text does, by (3). By induction over
  the windows (the first starts at the text's start, so its scan is the text's), A's scan is the
  text's from the previous splice point until some match looks past ``e``; a match of these
  patterns looks past its end at most through the whitespace run it ends in, plus one character,
  so by (2) none that ends at or before ``p`` reaches ``e > p + margin``. So ``p`` is a boundary
  of the whole text, A's pre-tokens before ``p`` and B's after it are the whole text's, and each
  pre-token is tokenized on its own by the same normalizer and model: the spliced ids are the
  text's. (1) checks the same thing from the outside: a normalizer's start (B's "▁") or a window
  edge that still reached ``p`` would change the tokens there in one window and not the other.
* A tokenizer without pre-tokens (one BPE over the whole text, as Llama 2's and Gemma's are)
  rests on (1) alone, an argument from locality rather than a proof: its merges depend on the
  text near them, so a cut changes the tokens near it; the two windows lack different text (A
  what follows ``e``, B what precedes ``b``), so tokens that both hold alike over ``margin`` on
  each side are out of reach of either cut, and so are the whole text's.

Memory: no text longer than a window is tokenized at once, and a window waiting for the next
one keeps its ids and the offsets of its tail, not the tokenizer's result (one result is held at
a time, two only while an overlap grows past a window's tail). The same corpus gives the same
ids whatever the memory limit or the number of workers: windows depend only on the document's
text and :data:`SEGMENT_BYTES`, not on how a reader or a batch cut it.

An encoder that cannot give offsets (the word unit; a tokenizer without a ``tokenizers``
backend, whose slow Python tokenizer gives none) gets the text itself, cut as before at a
newline, else after a space, else at a character boundary: exact for the word unit, whose words
never span whitespace (a word longer than a segment aside), not for such a tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

# Fixed, so that the same corpus gives the same token ids (and filter bytes) whatever the
# memory limit or number of workers; its tokenization costs a bounded ~40 MB at most.
SEGMENT_BYTES = 256 << 10
# Measured bytes of tokenizer working memory per byte of text tokenized in one batch (80-150
# for SmolLM2's tokenizer on code; rounded up).
TOKENIZE_BYTES_PER_BYTE = 128
# How far back from the limit to look for a neutral cut before settling for any newline.
_NEUTRAL_WINDOW = 64 << 10
# Two consecutive windows first overlap by 1/32 of a window (8 KiB: 3% of the text tokenized
# twice); while no splice point is found, the overlap grows 4-fold, up to half a window (so a
# window is tokenized at most three times).
_FIRST_OVERLAP_SHARE = 32
_OVERLAP_GROWTH = 4
# Characters on each side of a splice point where both windows must agree (at most).
_MARGIN = 256

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
        chars: for a piece of a long text that :func:`split_long` tokenized: the characters of
            text its ids cover (0 otherwise).
    """

    text: str
    continues: bool = False
    ids: np.ndarray | None = field(default=None, compare=False)
    where: str = ""
    chars: int = field(default=0, compare=False)

    @property
    def size(self) -> int:
        """Characters of text, or token ids: what encoding it costs (for a piece of a long text
        tokenized already, the characters it covers: a batch holds as much text as ever)."""
        return len(self.text) if self.ids is None else max(int(self.ids.shape[0]), self.chars)


class Spans(Protocol):
    """One text's tokens, from an encoder that knows where each token lies in the text."""

    @property
    def ids(self) -> np.ndarray:
        """uint32 `(num_tokens,)`: the token ids, as the encoder gives them for the text."""
        ...

    def offsets(self, first: int, stop: int) -> np.ndarray:
        """int64 `(stop - first, 2)`: each token's [start, end) characters in the text."""
        ...

    def words(self, first: int, stop: int) -> np.ndarray | None:
        """int64 `(stop - first,)`: each token's pre-token (word) index; None if unknown."""
        ...


SpansEncoder = Callable[[str], Spans]


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


def split_long(
    documents: Iterable[Document],
    limit: int = SEGMENT_BYTES,
    encode: SpansEncoder | None = None,
) -> Iterator[Document]:
    """The same documents, none longer than ``limit`` characters (or ids) encoded at once.

    A tokenizer's working memory grows with the text it is given at once (about 80-150 bytes
    per input byte measured for SmolLM2's: a 41 MB single-line file tokenized whole peaked at
    2.8 GB), so no text longer than :data:`SEGMENT_BYTES` is ever tokenized at once, and a batch
    holds at most the bytes the worker's share of ``--memory-limit`` allows.

    With ``encode`` (a tokenizer that gives character offsets), a document longer than ``limit``,
    or a document that continues (with those that continue it: a text file read in segments),
    is tokenized here in overlapping windows spliced where they agree (see the module), and comes
    out as pre-tokenized pieces (``ids``; all but the last ``continues``) whose ids, end to end,
    are the tokenizer's ids of the whole text. Without ``encode``, a text longer than ``limit``
    is cut into continued text segments at :func:`cut_point`. Pre-tokenized documents are cut
    every ``limit`` ids. Shorter texts pass unchanged (the caller encodes them in batches).
    """
    documents = iter(documents)
    for document in documents:
        if document.ids is not None:
            yield from _split_ids(document, limit)
        elif encode is not None and (document.continues or len(document.text) > limit):
            chain = _Chain(document, documents)
            yield from _spliced(chain, limit, encode)
            if chain.tail is not None:
                yield from _split_ids(chain.tail, limit)
        else:
            yield from _cut_text(document, limit)


def _cut_text(document: Document, limit: int) -> Iterator[Document]:
    """A text document, cut into continued segments at :func:`cut_point` when longer than
    ``limit`` (for encoders without offsets)."""
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


# ------------------------------------------------------------------------------------------------
# Splicing overlapping windows


class _Chain:
    """The text of a document and of the documents that continue it, read as far as asked and
    held from the start of the current window on (absolute character positions)."""

    def __init__(self, first: Document, rest: Iterator[Document]) -> None:
        self.where = first.where
        self.continues = first.continues  # the last document read goes on
        self.tail: Document | None = None  # a pre-tokenized document read past the chain
        self._rest = rest
        self._text = first.text
        self._base = 0  # the absolute position of self._text[0]

    def text(self, start: int, stop: int) -> str:
        """``text[start:stop]`` (shorter at the end), reading on as needed."""
        while self._base + len(self._text) < stop and self.continues and self.tail is None:
            following = next(self._rest, None)
            if following is None:
                break  # a reader that ended mid-document: the last piece still continues
            if following.ids is not None:
                self.tail = following  # not text: the chain ends here (and carries over)
                break
            self._text += following.text
            self.continues = following.continues
        return self._text[start - self._base : stop - self._base]

    def ends_by(self, stop: int) -> bool:
        """Whether the text ends at or before ``stop`` (reads one character past it)."""
        return len(self.text(stop, stop + 1)) == 0

    def release(self, start: int) -> None:
        """Forget the text before ``start``."""
        if start > self._base:
            self._text = self._text[start - self._base :]
            self._base = start


class _Window:
    """The tokens of ``text[start:stop]`` (``last``: the text ends at ``stop``): their ids, and
    their offsets (absolute) and pre-tokens from the encoder's result while it is held, or, once
    :meth:`settle` let it go, for the tokens of the window's tail only."""

    def __init__(self, chain: _Chain, start: int, limit: int, encode: SpansEncoder) -> None:
        text = chain.text(start, start + limit)
        self.start, self.stop = start, start + len(text)
        self.last = chain.ends_by(self.stop)
        self._spans: Spans | None = encode(text)
        self.ids: np.ndarray = self._spans.ids
        self.size = int(self.ids.shape[0])
        self._from = start  # offsets and words are known for tokens starting at or after it
        self._first = 0  # ... which are tokens _first.. (and the one before, if any)
        self._offsets = np.empty((0, 2), dtype=np.int64)
        self._words: np.ndarray | None = None
        self._first_word = -1

    def reload(self, chain: _Chain, encode: SpansEncoder) -> None:
        """Tokenize the window's text again (the same tokens) and hold the result."""
        if self._spans is None:
            self._spans = encode(chain.text(self.start, self.stop))
            self._from, self._first = self.start, 0

    def settle(self, start: int) -> None:
        """Keep the offsets and pre-tokens of the tokens that start at or after ``start`` (and of
        the one before them), and let the encoder's result go: a window waiting for the next
        one holds its ids and its tail only, not a tokenizer's whole result."""
        if self._spans is None:
            return
        first = max(self.first_from(start) - 1, 0)
        self._offsets = self.offsets(first, self.size)
        self._words = self.words(first, self.size)
        found = self.words(0, 1)
        self._first_word = -1 if found is None or found.size == 0 else int(found[0])
        self._from, self._first, self._spans = start, first, None

    def holds(self, start: int) -> bool:
        """Whether the offsets of the tokens that start at or after ``start`` are known."""
        return self._spans is not None or start >= self._from

    def offsets(self, first: int, stop: int) -> np.ndarray:
        """Absolute character offsets `(stop - first, 2)` of tokens ``first..stop-1``."""
        if self._spans is None:
            assert first >= self._first
            return self._offsets[first - self._first : stop - self._first]
        found = np.asarray(self._spans.offsets(first, stop), dtype=np.int64).reshape(-1, 2)
        return found + self.start

    def words(self, first: int, stop: int) -> np.ndarray | None:
        """The pre-token index of tokens ``first..stop-1``; None if the encoder gives none."""
        if self._spans is None:
            assert first >= self._first or (first == 0 and stop == 1)
            if self._words is None:
                return None
            if first < self._first:
                return np.array([self._first_word], dtype=np.int64)
            return self._words[first - self._first : stop - self._first]
        found = self._spans.words(first, stop)
        return None if found is None else np.asarray(found, dtype=np.int64)

    def one_word(self) -> bool:
        """Whether all the window's tokens lie in one pre-token (or none are reported)."""
        if self.size == 0:
            return True
        first, last = self.words(0, 1), self.words(self.size - 1, self.size)
        return first is None or last is None or first.size == 0 or int(first[0]) == int(last[0])

    def first_from(self, char: int) -> int:
        """The index of the first token that starts at or after absolute ``char`` (token
        starts never decrease)."""
        if self._spans is None:
            assert char >= self._from
            starts = self._offsets[:, 0]
            return self._first + int(np.searchsorted(starts, char, side="left"))
        low, high = 0, self.size
        while low < high:
            middle = (low + high) // 2
            if int(self.offsets(middle, middle + 1)[0, 0]) < char:
                low = middle + 1
            else:
                high = middle
        return low


def _spliced(chain: _Chain, limit: int, encode: SpansEncoder) -> Iterator[Document]:
    """The ids of the chain's text, in continued pieces: one per window, each from the previous
    splice point to the next."""
    first_overlap = max(limit // _FIRST_OVERLAP_SHARE, 1)
    margin = max(min(_MARGIN, first_overlap // 8), 1)
    window = _Window(chain, 0, limit, encode)
    begin, done = 0, 0  # the window's first token not yet given out, and where it starts
    while not window.last:
        overlap = first_overlap
        while True:
            following_start = max(window.stop - overlap, done)
            if not window.holds(following_start):
                window.reload(chain, encode)  # a longer overlap than its tail (seldom)
            window.settle(following_start)
            following = _Window(chain, following_start, limit, encode)
            found = _splice(chain, window, following, done, margin)
            if found is not None or overlap >= limit // 2:
                break
            overlap = min(overlap * _OVERLAP_GROWTH, limit // 2)
        if found is None:  # none over half a window: settle for the shortest agreement
            found = _splice(chain, window, following, done, 1)
        if found is None:  # none at all: cut at a token boundary of A
            cut, at = _forced_cut(chain, window, following.start, done, margin)
            following = _Window(chain, at, limit, encode)
            found = cut, 0, at
        cut, resume, at = found
        yield Document("", True, window.ids[begin:cut], chain.where, at - done)
        chain.release(following.start)
        window, begin, done = following, resume, at
    ids = window.ids[begin:]
    yield Document("", chain.continues, ids, chain.where, window.stop - done)


def _splice(
    chain: _Chain, a: _Window, b: _Window, done: int, margin: int
) -> tuple[int, int, int] | None:
    """The splice point of windows ``a`` and ``b`` after ``done`` (see the module):
    ``(i, j, p)``, A's tokens before ``i`` and B's from ``j`` on, ``p`` where both start; None
    when there is none."""
    a_first = a.first_from(b.start)  # A's tokens in the overlap: a_first..a.size-1
    b_stop = b.first_from(a.stop)  # B's: 0..b_stop-1
    if a_first >= a.size or b_stop == 0:
        return None
    a_offsets = a.offsets(a_first, a.size).tolist()
    a_keys = _token_keys(a.ids[a_first:].tolist(), a_offsets)
    b_keys = _token_keys(b.ids[:b_stop].tolist(), b.offsets(0, b_stop).tolist())
    b_index = {key: j for j, key in enumerate(b_keys)}
    # For each of A's tokens, j - i of the same token in B (None: B has none there): a run of
    # one shift is a stretch where both windows hold the same tokens, aligned.
    shifts = [b_index[key] - i if key in b_index else None for i, key in enumerate(a_keys)]
    starts_word = _word_starts(a, a_first, b, b_stop)
    center = (b.start + a.stop) // 2
    best: tuple[int, int, int] | None = None
    run = 0
    for stop in range(1, len(shifts) + 1):
        if stop < len(shifts) and shifts[stop] is not None and shifts[stop] == shifts[stop - 1]:
            continue
        shift, first, run = shifts[run], run, stop  # shifts[first:stop]: one run
        if shift is None:
            continue
        low, high = a_offsets[first][0] + margin, a_offsets[stop - 1][1] - margin
        for k in range(first + 1, stop):
            p = a_offsets[k][0]
            if not low <= p <= high or p <= done or p < a_offsets[k - 1][1]:
                continue
            if best is not None and abs(p - center) >= abs(best[2] - center):
                continue
            if starts_word is not None and not (starts_word[0][k] and starts_word[1][k + shift]):
                continue
            if _has_non_space(chain.text(p, p + margin)):
                best = (a_first + k, k + shift, p)
    return best


def _token_keys(ids: list[int], offsets: list[list[int]]) -> list[tuple[int, int, int, int]]:
    """Each token's key: (id, start, end, how many tokens before it had the same three). Equal
    keys in two windows are the same token at the same place."""
    keys = []
    seen: dict[tuple[int, int, int], int] = {}
    for token, (start, end) in zip(ids, offsets, strict=True):
        rank = seen.get((token, start, end), 0)
        seen[token, start, end] = rank + 1
        keys.append((token, start, end, rank))
    return keys


def _word_starts(
    a: _Window, a_first: int, b: _Window, b_stop: int
) -> tuple[list[bool], list[bool]] | None:
    """Whether each of A's tokens from ``a_first`` and each of B's before ``b_stop`` begins a
    pre-token (word); None when the encoder reports none, or all of A is one pre-token (a
    tokenizer without a pre-tokenizer, or a pre-token longer than a window)."""
    a_words = a.words(max(a_first - 1, 0), a.size)
    b_words = b.words(0, b_stop)
    if a_words is None or b_words is None or a.one_word():
        return None
    a_new = np.diff(a_words, prepend=-1) != 0
    if a_first:
        a_new = a_new[1:]
    b_new = np.diff(b_words, prepend=-1) != 0
    return a_new.tolist(), b_new.tolist()


def _has_non_space(text: str) -> bool:
    """Whether ``text`` holds a character that is not whitespace."""
    return bool(text.strip())


def _forced_cut(chain: _Chain, a: _Window, low: int, done: int, margin: int) -> tuple[int, int]:
    """Where to cut when no splice point was found: before one of A's tokens that starts at or
    after the previous tokens' end, after ``done``, in ``[low, a.stop)``; the place nearest the
    middle, preferring a token that begins a pre-token with a character that is not whitespace
    within ``margin`` (a boundary of the whole text, by the module's argument); A's end when
    there is none. The cut is at the token's start, moved back over the whitespace before it
    that no token of A covers (offsets may leave out a space). Returns (the token's index, the
    place)."""
    first = a.first_from(max(low, done + 1))
    if first >= a.size:
        return a.size, a.stop
    offsets = a.offsets(max(first - 1, 0), a.size).tolist()
    words = None if a.one_word() else a.words(max(first - 1, 0), a.size)
    if first == 0:  # no token before: pretend one that ends at the window's start
        offsets.insert(0, [a.start, a.start])
        words = None if words is None else np.concatenate([[-1], words])
    center = (low + a.stop) // 2
    best: tuple[bool, int, int, int] = (True, abs(a.stop - center), a.stop, a.size)
    previous_end = offsets[0][1]  # the end of the tokens before token k
    for k in range(1, len(offsets)):
        start, end = offsets[k]
        if start >= previous_end and start > done:
            gap = chain.text(previous_end, start)
            at = start - (len(gap) - len(gap.rstrip()))
            begins = words is not None and words[k] != words[k - 1]
            clean = begins and _has_non_space(chain.text(start, min(start + margin, a.stop)))
            ranked = (not clean, abs(at - center), at)
            if at > done and ranked < best[:3]:
                best = (*ranked, first + k - 1)
        previous_end = max(previous_end, end)
    return best[3], best[2]


# ------------------------------------------------------------------------------------------------
# Batches


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
