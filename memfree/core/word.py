"""The word unit's masker: MemFree decoding over normalized words instead of token ids.

Its promise: after every step, the text of the row (prompt and generated tokens, special tokens
skipped, read as complete text) holds no stored word n-gram that the generated tokens created. A
token may extend the partial last word, complete it, carry whole words, or start new ones; each
candidate is checked exactly, so a generation may be cut anywhere.

How a step stays cheap. For each row, the masker keeps the text since a safe cut, its words and
its partial last word (:class:`~memfree.core.row_text.RowText`). Every vocabulary token was
classified once (:class:`~memfree.core.word_vocab.WordVocab`). Tokens that start clean take the
token guard's arithmetic (:mod:`memfree.core.word_fast`); the few others (a combining mark first,
or the continuation of a character split across tokens) are decoded and normalized exactly, one
by one, on the row's last words. A step costs most when a row's last n-1 words begin a stored
n-gram: word contexts are shorter and repeat more than token contexts, so they open more often.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from memfree.core.row_text import RowText, tail
from memfree.core.word_fast import RowPlan, WordBits, WordSide, fast_mask
from memfree.core.word_index import WordIndex
from memfree.core.word_vocab import NONE, WordVocab
from memfree.errors import FilterError, FilterMismatchError
from memfree.filterfile.protocol import NgramSet
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.words import (
    NORMALIZER,
    UNICODE_VERSION,
    WORD_MULTIPLIER,
    created_word_ngrams,
    ngram_hash_rows,
    word_poly,
    words,
)


class WordMasker:
    """Bans every token after which a row's text would hold a new stored word n-gram.

    Computed on the CPU: the rows' text lives on the host, so each step reads the rows back; the
    mask goes to the requested device. Special tokens add no text and are never banned. Threads
    sharing the masker each keep their own rows' text states from step to step.

    Args:
        ngram_filter: a word filter in memfree's format (the prefix-keyed index or the blocked
            Bloom layout).
        tokenizer: the model's tokenizer's :class:`~memfree.vocab.info.TokenizerInfo` (each
            token's bytes are read from it).
        special_token_ids: ids that add no text and are never banned.

    Attributes:
        context_width: None: it reads each row's whole text.

    Raises:
        FilterMismatchError: the filter's words were normalized another way.
        FilterError: the filter is not in memfree's format (a pybloomfiltermmap3 file).
        ValueError: no tokenizer.
        UnsupportedTokenizerError: the tokenizer's decoder is not one memfree can read.
    """

    def __init__(
        self,
        ngram_filter: NgramSet,
        tokenizer: TokenizerInfo | None,
        special_token_ids: Iterable[int] = (),
    ) -> None:
        self.filter = ngram_filter
        self.n = ngram_filter.n
        self.context_width: int | None = None
        self.special_token_ids = tuple(sorted({int(token) for token in special_token_ids}))
        header = ngram_filter.header
        if header.normalizer != NORMALIZER:
            raise FilterMismatchError(
                f"{ngram_filter.path}: words were normalized with "
                f"{header.normalizer!r}, this memfree uses {NORMALIZER!r}; rebuild the "
                "filter with this version"
            )
        if header.unicode_version not in (None, UNICODE_VERSION):
            warnings.warn(
                f"memfree: {ngram_filter.path} was built with Unicode "
                f"{header.unicode_version}, this Python has {UNICODE_VERSION}; words "
                "that use characters added in between may split differently",
                RuntimeWarning,
                stacklevel=4,
            )
        if tokenizer is None:
            raise ValueError(
                "the word guard needs the model's tokenizer (it reads each token's bytes): "
                "MemFreeLogitsProcessor(word_filter, tokenizer=tok)"
            )
        self.tokenizer = tokenizer
        self._table = tokenizer.token_bytes
        self._byte_ids = tokenizer.byte_fallback_ids
        self._word_bits = self._bits_of(ngram_filter)
        self._vocabs: dict[int, WordVocab] = {}
        self._static: dict[int, np.ndarray] = {}
        self._no_text = set(self.special_token_ids)
        self._local = threading.local()

    def _bits_of(self, ngram_filter: NgramSet) -> WordSide:
        index = ngram_filter.prefix_index()
        if index is not None:
            return WordIndex.of(self.n, index)
        bits = ngram_filter.blocked_bits()
        if bits is None:
            raise FilterError(
                f"{ngram_filter.path}: a word filter in the {ngram_filter.layout} layout; the "
                "word guard reads memfree's own format: rebuild it with `memfree build --unit word`"
            )
        return WordBits.of(self.n, bits)

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with no row states and map the filter's bits anew."""
        state = self.__dict__.copy()
        state.pop("_local", None)
        state.pop("_word_bits", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
        self._word_bits = self._bits_of(self.filter)

    def describe(self) -> dict[str, Any]:
        return {"normalizer": NORMALIZER}

    # -- tables -------------------------------------------------------------------------------------

    def vocab(self, vocab_size: int) -> WordVocab:
        """The per-vocabulary tables for scores with ``vocab_size`` columns (built once)."""
        found = self._vocabs.get(vocab_size)
        if found is None:
            table: list[bytes | None] = list(self._table[:vocab_size])
            table += [b""] * (vocab_size - len(table))
            for token in self._no_text:
                if token < vocab_size:
                    table[token] = None
            found = WordVocab.build(table, self.n)
            static = np.zeros(vocab_size, dtype=bool)
            if found.inner_ngrams:
                tokens = list(found.inner_ngrams)
                rows = [ngram for token in tokens for ngram in found.inner_ngrams[token]]
                owner = np.repeat(tokens, [len(found.inner_ngrams[t]) for t in tokens])
                hits = self.filter.contains(np.asarray(rows, dtype=np.uint64))
                static[owner[hits]] = True
            # The vocabulary is published last: another thread that finds it finds both.
            self._static[vocab_size] = static
            self._vocabs[vocab_size] = found
        return found

    def _row_text(self, ids: np.ndarray, previous: dict[bytes, RowText]) -> RowText:
        """The row's text state, extended from the previous step's (``previous``, by the ids of
        each row) when it is there."""
        key = ids.tobytes()
        cached = previous.get(key)
        if cached is not None:
            return cached
        keep = 2 * self.n + 2
        parent = previous.get(ids[:-1].tobytes()) if ids.shape[0] else None
        if parent is not None:
            last = int(ids[-1])
            return parent.extended(self._bytes_of(last), keep, last in self._byte_ids)
        if not self._byte_ids:
            return RowText.of(b"".join(self._bytes_of(int(token)) for token in ids), keep)
        state = RowText.of(b"", keep)
        for token in ids.tolist():
            state = state.extended(self._bytes_of(token), keep, token in self._byte_ids)
        return state

    def _byte_mask(self, vocab_size: int) -> np.ndarray:
        mask = np.zeros(vocab_size, dtype=bool)
        mask[[i for i in self._byte_ids if i < vocab_size]] = True
        return mask

    def _bytes_of(self, token: int) -> bytes:
        if token in self._no_text or token >= len(self._table) or token < 0:
            return b""
        return self._table[token] or b""

    # -- the step -----------------------------------------------------------------------------------

    def banned_mask(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Which tokens would add a stored word n-gram to each row's text.

        Args:
            contexts: int64 `(rows, seq_len)` token ids (prompt and generated tokens); a row
                may be left-padded with negative ids, which add no text.
            vocab_width: number of candidate tokens (ids past the tokenizer's add no text).
            device: where the results go (default: that of ``contexts``).

        Returns:
            (bool `(rows, vocab_width)` banned tokens, bool `(rows,)` rows where some
            candidate's context could begin a stored n-gram, so candidates were hashed).
        """
        device = torch.device(device or contexts.device)
        ids_np = contexts.detach().cpu().numpy().astype(np.int64, copy=False)
        vocab = self.vocab(vocab_width)
        static = self._static[vocab_width]
        batch = ids_np.shape[0]
        mask = np.zeros((batch, vocab_width), dtype=bool)
        checked = np.zeros(batch, dtype=bool)
        # Each thread keeps its own rows' states: threads sharing the masker would otherwise evict
        # each other's (the states are exact for their ids, so any cache gives the same masks).
        previous: dict[bytes, RowText] = getattr(self._local, "rows", {})
        cache: dict[bytes, RowText] = {}
        plans = []
        for row in range(batch):
            ids = _unpadded(ids_np[row])
            state = self._row_text(ids, previous)
            cache[ids.tobytes()] = state
            plans.append(self._plan(state, vocab))
        self._local.rows = cache
        # Every row's lookups go to the filter together: one pass per kind of lookup.
        fast_mask(plans, vocab, self._word_bits, mask, checked)
        for row, plan in enumerate(plans):
            mask[row] |= static & plan.fast
        self._slow(plans, vocab, mask, checked)
        mask[:, [t for t in self._no_text if t < vocab_width]] = False
        return torch.from_numpy(mask).to(device), torch.from_numpy(checked).to(device)

    def created_ngrams(self, ids: torch.Tensor | np.ndarray, token: int) -> list[tuple[str, ...]]:
        """The word n-grams that appending ``token`` to the row ``ids`` creates in its text
        (exactly: its text decoded and normalized; quick after a step over the same row)."""
        row = _unpadded(np.asarray(torch.as_tensor(ids).cpu(), dtype=np.int64))
        state = tail(self._row_text(row, getattr(self._local, "rows", {})), self.n + 2)
        old = words(state.reading())
        new = words(state.reading(self._bytes_of(token), token in self._byte_ids))
        return created_word_ngrams(old, new, self.n)

    def _plan(self, state: RowText, vocab: WordVocab) -> RowPlan:
        """A row's words and which candidates take the fast path."""
        pending = bool(state.pending)
        fast = vocab.fast_after_pending if pending else vocab.fast
        if state.run:  # a byte token would extend the run, whose reading may then change
            fast = fast & ~self._byte_mask(vocab.kind.shape[0])
        history = state.hashes  # H: complete reading's words, partial last word included
        if state.partial and not pending:
            before = history[:-1]  # W: the words before the partial one
            partial = state.partial.encode("utf-8")
            p_poly, p_power = word_poly(partial), pow(WORD_MULTIPLIER, len(partial), 1 << 64)
        else:
            before, p_poly, p_power = history, 0, 1
        return RowPlan(state, fast, history, before, p_poly, p_power)

    def _slow(
        self, plans: list[RowPlan], vocab: WordVocab, mask: np.ndarray, checked: np.ndarray
    ) -> None:
        """Exact, for the candidates that do not start clean: decode and normalize the row's
        text with each token and compare the words."""
        ngrams: list[tuple[str, ...]] = []
        owners: list[tuple[int, int]] = []
        unclean = vocab.kind != NONE
        for row, plan in enumerate(plans):
            tokens = np.flatnonzero(~plan.fast & unclean)
            if not tokens.size:
                continue
            state = tail(plan.state, self.n + 2)
            old = words(state.reading())
            for token in tokens.tolist():
                new = words(state.reading(vocab.data[token], token in self._byte_ids))
                created = created_word_ngrams(old, new, self.n)
                ngrams.extend(created)
                owners.extend([(row, token)] * len(created))
                if created:
                    checked[row] = True
        if not ngrams:
            return
        hits = self.filter.contains(ngram_hash_rows(ngrams))
        found = np.asarray(owners, dtype=np.int64)[hits]
        mask[found[:, 0], found[:, 1]] = True


def _unpadded(ids: np.ndarray) -> np.ndarray:
    """A row without its left padding (negative ids, which engine adapters put before ragged
    rows): padding adds no text, and the row's state is then found from step to step."""
    if not ids.shape[0] or ids[0] >= 0:
        return ids
    real = np.flatnonzero(ids >= 0)
    return ids[real[0] :] if real.shape[0] else ids[:0]


__all__ = ["WordMasker"]
