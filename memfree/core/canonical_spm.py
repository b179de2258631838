"""Canonical decoding for SentencePiece-style BPE (Llama 2, Mistral up to v0.3, Phi-3, Gemma).

The same rule as :mod:`memfree.core.canonical`: a candidate is allowed only if the row's ids
with it appended are a prefix of the tokenizer's tokenization of some text that begins with
their text; end of sequence only where they are the tokenization of the text as it stands.

These tokenizers cut text at added tokens only, and BPE runs over each segment whole, so the
condition is local (:mod:`memfree.vocab.sentencepiece`): a segment's tokens are the tokenizer's
own exactly when each piece is BPE's own, each adjacent pair of pieces is, each run of byte
tokens spells characters the vocabulary lacks, the segment starts with ``"▁"`` where the
tokenizer puts one there, and its text spells no added token. Each condition involves one token
and the one before it, so a prefix that meets them is the tokenization of its own text: every
row the guard leaves is canonical as it stands, but for a character whose bytes are not all
written yet (then only its continuations are allowed) and, where the normalizer puts ``"▁"``
before every segment (``Prepend``), a segment that is that ``"▁"`` alone (no text gives it: it
may go on, not end). Nothing is pending: a row cut anywhere else tokenizes back to its ids.

A row's state is its last piece (or none: a segment's start, or after a character spelled in
bytes), whether the next token must start with ``"▁"``, the bytes of a character begun, and how
much of an added token the text's end spells. A row one token longer than a row of the last
step is advanced from that row's state; a row seen first is read once (each segment checked
with the tokenizer's own model).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from memfree.core.canonical_chars import code_points, utf8_length
from memfree.core.row_automaton import RowAutomaton
from memfree.core.state_table import StateTable, TableMasker, row_bounds
from memfree.core.table_cache import cached_tables
from memfree.vocab.bpe import tables_key
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.sentencepiece import (
    PREPEND_ALWAYS,
    PREPEND_FIRST,
    PREPEND_NEVER,
    SPACE,
    SentencePieceBpe,
)

_CACHE = 1024  # states whose allowed candidates are kept
_BROKEN = ("broken",)  # not canonical: only a prompt makes one; it may only end
_PAST = ("past",)  # an id past the vocabulary: no text gives it

State = tuple[Any, ...]  # ("ok", last piece | -1, prefix, begun bytes, progress, lone) | _BROKEN


class SentencePieceMasker(TableMasker):
    """Bans every candidate that would make a row's ids not its text's tokenization, for a
    SentencePiece-style BPE tokenizer.

    Args:
        info: the tokenizer (see :mod:`memfree.vocab.sentencepiece`).
        end_token_ids: ids that may end the output (allowed where the row is its text's
            tokenization, or where nothing else is).

    Raises:
        CanonicalUnsupportedError: another tokenizer family.
    """

    UNPICKLED = ("_lock", "_answers", "_progress_bans", "_progress_bytes", "table", "automaton")

    def __init__(self, info: TokenizerInfo, end_token_ids: Iterable[int] = ()) -> None:
        self.info = info
        self.bpe = sentencepiece_tables(info)
        self.end_token_ids = tuple(sorted({int(t) for t in end_token_ids}))
        size = self.bpe.vocab_size
        self._cuts = frozenset(info.special_token_ids) | frozenset(self.bpe.added.values())
        # Added tokens that are not special, allowed where a segment may end (a cut); but not
        # where the normalizer puts "▁" before every segment (Phi-3's "</s>"): decode writes
        # that "▁" after the token as a space, which tokenizing the text again doubles, so no
        # text after the token reads back as its ids.
        self._added = np.zeros(size, dtype=bool)
        for token in self.bpe.added.values():
            if token < size and token not in info.special_token_ids:
                self._added[token] = self.bpe.prepend != PREPEND_ALWAYS
        self._contents = tuple(content for content in self.bpe.added if content)
        self._begins = frozenset(c[:k] for c in self._contents for k in range(1, len(c)))
        self._reach = max((len(c) for c in self._contents), default=1)
        texts = [None if p is None else p.replace(SPACE, " ") for p in self.bpe.pieces]
        self._texts = texts
        self._holding = np.array(
            [t is not None and any(c in t for c in self._contents) for t in texts], dtype=bool
        )
        self._bytes = np.flatnonzero(self.bpe.byte_of >= 0)
        self._space = next((t for t, p in enumerate(self.bpe.pieces) if p == SPACE), -1)
        self._leading = _leading(info)
        self._warned = False
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._answers: OrderedDict[State, np.ndarray] = OrderedDict()
        self._progress_bans: dict[str, np.ndarray] = {}
        self._progress_bytes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.table = StateTable(self._fill)
        # Rows to state ids (a state is its own key: SentencePiece-style rows need no more).
        self.automaton = RowAutomaton(
            read=lambda ids, array: self.state(ids),
            advance=self.advance,
            key_of=lambda state: state,
            past=_PAST,
            vocab_size=self.bpe.vocab_size,
        )

    # -- the step -------------------------------------------------------------------------------

    def step(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
        """:meth:`banned_mask`, and the pending candidates: none (a SentencePiece-style row the
        guard leaves is its text's tokenization, or inside a character)."""
        device = torch.device(device or contexts.device)
        arrays = contexts.detach().cpu().numpy().astype(np.int64, copy=False)
        count = arrays.shape[0]
        firsts, past = row_bounds(arrays, self.bpe.vocab_size)
        automaton = self.automaton
        with automaton.lock:
            ids = automaton.step(arrays, firsts, past)
            banned, _ = self.table.gather(
                automaton.key_ids(ids), automaton.keys, automaton.generation, vocab_width,
                device, [],
            )  # fmt: skip
        return banned, torch.ones(count, dtype=torch.bool, device=device), []

    def _fill(self, row: np.ndarray, key: State, width: int) -> None:
        """``row``: the candidates a state bans (end of sequence where it may not end)."""
        row[:] = True
        ends = [token for token in self.end_token_ids if token < width]
        if key[0] == "ok":
            allowed = self._allowed(key)
            size = min(width, self.bpe.vocab_size)
            np.logical_not(allowed[:size], out=row[:size])
            if not _may_end(key):
                return
        row[ends] = False

    # -- questions about one row ----------------------------------------------------------------

    def allowed(self, ids: list[int]) -> np.ndarray:
        """bool `(vocab_size,)`: the candidates that keep ``ids`` canonical (ends excluded)."""
        key = self.state(ids)
        if key[0] != "ok":
            return np.zeros(self.bpe.vocab_size, dtype=bool)
        return self._allowed(key).copy()

    def may_end(self, ids: list[int]) -> bool:
        """Whether end of sequence is allowed after ``ids``: their text, ended here, is
        tokenized as ``ids`` (or the row is not canonical at all: only a prompt makes one)."""
        key = self.state(ids)
        return key[0] != "ok" or _may_end(key)

    def state(self, ids: list[int]) -> State:
        """A row's state, read from its ids: each segment checked with the tokenizer's model."""
        if any(token < 0 or token >= self.bpe.vocab_size for token in ids):
            return _PAST
        led = 0  # the tokens before the text (beginning of sequence)
        while led < len(ids) and ids[led] in self._cuts:
            led += 1
        # Put there by the tokenizer (``tokenizer(text)``), the text after them is its first
        # segment; else the text wrote them ("<s>Hello"), and under prepend_scheme="first" the
        # segment after them gets no "▁".
        start, first = led, not led or tuple(ids[:led]) == self._leading
        key: State = self._segment_start(first)
        for index in range(led, len(ids) + 1):
            if index < len(ids) and ids[index] not in self._cuts:
                continue
            segment = ids[start:index]
            key = self._read_segment(segment, first, led > 0, final=index == len(ids))
            if key[0] != "ok" or (index < len(ids) and not _may_end(key)):
                self._note()
                return _BROKEN
            if index < len(ids):
                key = self._segment_start(first=False)
            start, first = index + 1, False
        return key

    def advance(self, key: State, token: int) -> State:
        """The state of a row one token longer than a row in state ``key``."""
        if key[0] != "ok":
            return _PAST if token >= self.bpe.vocab_size or token < 0 else key
        if token in self._cuts:
            return self._segment_start(first=False) if _may_end(key) else _BROKEN
        if token >= self.bpe.vocab_size or token < 0 or not self._allowed(key)[token]:
            return _BROKEN
        _, _, prefix, begun, progress, _ = key
        byte = int(self.bpe.byte_of[token])
        if byte < 0:
            text = self._texts[token] or ""
            lone = prefix and self.bpe.prepend == PREPEND_ALWAYS and token == self._space
            return ("ok", token, False, b"", self._progress(progress + text), lone)
        begun += bytes([byte])
        if len(begun) < utf8_length(begun[0]):
            return ("ok", -1, False, begun, progress, False)
        return ("ok", -1, False, b"", self._progress(progress + begun.decode("utf-8")), False)

    # -- reading ---------------------------------------------------------------------------------

    def _segment_start(self, first: bool) -> State:
        prepend = self.bpe.prepend
        prefix = prepend != PREPEND_NEVER and (first or prepend != PREPEND_FIRST)
        return ("ok", -1, prefix, b"", "", False)

    def _read_segment(self, segment: list[int], first: bool, led: bool, final: bool) -> State:
        """The state after a segment's tokens, or ``_BROKEN`` where they are not the
        tokenizer's for its text (``led``: the row begins with tokens the tokenizer may have
        put there, so under ``prepend_scheme="first"`` the text may also have written them,
        and its first segment then gets no ``"▁"``)."""
        if not segment:
            return self._segment_start(first)
        byte_of = self.bpe.byte_of
        parts: list[str] = []
        begun = b""
        for token in segment:
            byte = int(byte_of[token])
            if byte >= 0:
                begun += bytes([byte])
                if len(begun) == utf8_length(begun[0]):
                    try:
                        parts.append(begun.decode("utf-8"))
                    except UnicodeDecodeError:
                        return _BROKEN
                    begun = b""
                continue
            piece = self.bpe.pieces[token]
            if begun or piece is None:  # a character left unfinished, or an unknown token
                return _BROKEN
            parts.append(piece)
        if begun and not (final and self._may_begin(begun)):
            return _BROKEN
        normalized = "".join(parts)
        whole = segment[: len(segment) - len(begun)]
        prefix = self._segment_start(first)[2]
        either = first and led and self.bpe.prepend == PREPEND_FIRST  # "<s>Hello" or "Hello"
        if prefix and not normalized.startswith(SPACE) and not either:
            return _BROKEN
        if whole and self.bpe.tokenize(normalized) != whole:
            return _BROKEN
        text = normalized.replace(SPACE, " ")
        if any(content in text for content in self._contents):
            return _BROKEN
        last = whole[-1] if whole and byte_of[whole[-1]] < 0 and not begun else -1
        lone = self.bpe.prepend == PREPEND_ALWAYS and prefix and segment == [self._space]
        return ("ok", last, prefix and not whole, begun, self._progress(text), lone)

    def _progress(self, text: str) -> str:
        """The longest end of ``text`` that begins an added token (its progress there)."""
        for length in range(min(len(text), self._reach - 1), 0, -1):
            if text[-length:] in self._begins:
                return text[-length:]
        return ""

    def _may_begin(self, begun: bytes) -> bool:
        """Whether some character the vocabulary lacks (so spelled in bytes) begins with the
        bytes ``begun``."""
        total = utf8_length(begun[0])
        if not total or any(not 0x80 <= b < 0xC0 for b in begun[1:]):
            return False
        low, high = code_points(begun)
        return self.bpe.lacks_some(max(low, (0, 0, 0x80, 0x800, 0x10000)[total]), high)

    # -- answers --------------------------------------------------------------------------------

    def _allowed(self, key: State) -> np.ndarray:
        """bool `(vocab_size,)`: the candidates state ``key`` allows (kept per state)."""
        with self._lock:
            cached = self._answers.get(key)
            if cached is not None:
                self._answers.move_to_end(key)
                return cached
        answer = self._compute(key)
        with self._lock:
            self._answers[key] = answer
            while len(self._answers) > _CACHE:
                self._answers.popitem(last=False)
        return answer

    def _compute(self, key: State) -> np.ndarray:
        _, last, prefix, begun, progress, lone = key
        bpe = self.bpe
        allowed = np.zeros(bpe.vocab_size, dtype=bool)
        if begun:  # inside a character: its next byte, where a character the vocabulary lacks
            for token in self._bytes.tolist():
                data = begun + bytes([int(bpe.byte_of[token])])
                if len(data) < utf8_length(data[0]):
                    allowed[token] = self._may_begin(data)
                else:
                    allowed[token] = self._completes(data, progress)
            return allowed
        allowed |= bpe.self_ok
        if last >= 0:
            allowed &= bpe.bigram_allowed(last)
        if prefix:
            allowed &= bpe.spaced
        else:
            tokens, starts = self._byte_starts(progress)
            allowed[tokens] = starts
        allowed &= ~self._holding
        if progress:
            allowed &= ~self._progress_banned(progress)
        if not lone:  # an added token that is not special: a cut, where the segment may end
            allowed |= self._added
        return allowed

    def _byte_starts(self, progress: str) -> tuple[np.ndarray, np.ndarray]:
        """The byte tokens and whether each may start a character after whole ones (the text's
        end ``progress``): a character the vocabulary lacks, or the first byte of some."""
        cached = self._progress_bytes.get(progress)
        if cached is None:
            starts = np.zeros(len(self._bytes), dtype=bool)
            for index, token in enumerate(self._bytes.tolist()):
                data = bytes([int(self.bpe.byte_of[token])])
                if utf8_length(data[0]) == 1:
                    starts[index] = self._completes(data, progress)
                elif utf8_length(data[0]) > 1:
                    starts[index] = self._may_begin(data)
            cached = self._progress_bytes[progress] = (self._bytes, starts)
        return cached

    def _completes(self, data: bytes, progress: str) -> bool:
        """Whether the bytes ``data`` spell a character the vocabulary lacks, and the text with
        it spells no added token."""
        try:
            char = data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        if char == " " or self.bpe.has_char(char):  # a space is always written "▁"
            return False
        return not any(c in progress + char for c in self._contents)

    def _progress_banned(self, progress: str) -> np.ndarray:
        """The pieces that finish an added token the text's end ``progress`` began."""
        cached = self._progress_bans.get(progress)
        if cached is None:
            cached = np.zeros(self.bpe.vocab_size, dtype=bool)
            for content in self._contents:
                for length in range(1, len(content)):
                    if progress.endswith(content[:length]):
                        cached |= self.bpe.starting_with(content[length:])
            self._progress_bans[progress] = cached
        return cached

    def _note(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                "memfree: a prompt's ids are not the tokenization of its text: canonical "
                "decoding allows only end of sequence after it. Tokenize prompts from their "
                "text (as generate(), vLLM and the CLI do), or pass canonical=False",
                RuntimeWarning,
                stacklevel=4,
            )


def _leading(info: TokenizerInfo) -> tuple[int, ...]:
    """The ids the tokenizer puts before a text (beginning of sequence), if any."""
    ids = info.tokenizer("x", add_special_tokens=True)["input_ids"]
    leading = []
    for token in ids:
        if token not in info.special_token_ids:
            break
        leading.append(int(token))
    return tuple(leading)


def _may_end(key: State) -> bool:
    """Whether a canonical row in state ``key`` is its text's tokenization as it stands: no
    character begun, and not a segment that is the normalizer's ``"▁"`` alone."""
    return not key[3] and not key[5]


_TABLES: dict[tuple[Any, ...], SentencePieceBpe] = {}
_TABLES_LOCK = threading.Lock()


def sentencepiece_tables(info: TokenizerInfo) -> SentencePieceBpe:
    """The tokenizer's tables, once per process and tokenizer: read from memfree's cache
    directory where a whole, matching file is there, else built and kept
    (:func:`~memfree.core.table_cache.cached_tables`; Llama 2's: 3–5 s to build, most of it
    reading its runs of spaces' rows from the merges)."""
    key = tables_key(info)
    with _TABLES_LOCK:
        tables = _TABLES.get(key)
        if tables is None:
            tables = _TABLES[key] = cached_tables(
                "sentencepiece", key, info.fingerprint, lambda: SentencePieceBpe.of(info),
                outside={"tokenizer": info.tokenizer},
                left_empty=lambda built: built.tree.caches(),
            )  # fmt: skip
        return tables


__all__ = ["SentencePieceMasker", "sentencepiece_tables"]
