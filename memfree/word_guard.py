"""The word guard: MemFree decoding over normalized words instead of token ids.

With a word filter (``memfree build --unit word``), :class:`MemFreeLogitsProcessor` becomes a
:class:`MemFreeWordLogitsProcessor`. Its promise: after every step, the text of the row (prompt
and generated tokens, special tokens skipped, read as complete text) holds no stored word n-gram
that the generated tokens created. A token may extend the partial last word, complete it, carry
whole words, or start new ones; each candidate is checked exactly, so a generation may be cut
anywhere, and end-of-sequence is always allowed.

How a step stays cheap. For each row, the guard keeps the text since a safe cut, its words and
its partial last word ``P`` (recomputed exactly from the chosen tokens' bytes). Every vocabulary
token was classified once (:class:`WordVocab`): the words its text adds, and whether its text
starts with a letter (then it extends ``P``) or a separator. Unicode normalization never reaches
back across a token that :func:`~memfree.words.starts_clean`, so for those tokens the n-grams a
candidate creates are a multiply-add away from per-row Horner states: the same arithmetic as the
token guard, with the prefix section skipping rows whose context begins no stored n-gram.
Tokens that add the same word share one lookup, and every row's lookups go to the filter in one
pass per step. The few other tokens (a combining mark first, or the continuation of a character
split across tokens) are decoded and normalized exactly, one by one, on the row's last words.

What a step costs depends on how often a row's last n-1 words begin a stored n-gram: then
every candidate is looked up, as the token guard does for a row whose last n-1 tokens do. Word
contexts are shorter and repeat more than token contexts, so they open more often.
"""

from __future__ import annotations

import codecs
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from memfree.errors import FilterMismatchError
from memfree.hashing import (
    HORNER_MULTIPLIER,
    fmix64_np,
    fmix64_reference,
    sparse_members_np,
)
from memfree.processor import MemFreeLogitsProcessor
from memfree.words import (
    NORMALIZER,
    UNICODE_VERSION,
    WORD_MULTIPLIER,
    WORD_OFFSET,
    is_word_char,
    ngram_hash_rows,
    normalize,
    starts_clean,
    word_hash,
    word_pattern,
    word_poly,
    words,
)

_MASK64 = (1 << 64) - 1
_U1 = np.uint64(1)
_M = HORNER_MULTIPLIER
_fmix_np = fmix64_np


# ------------------------------------------------------------------------------------------------
# Per-vocabulary tables

_NONE, _LEAD, _SEPARATOR = 0, 1, 2


@dataclass
class WordVocab:
    """What each token adds to text, precomputed once per vocabulary and n.

    ``kind``: 0 adds no text, 1 starts with a word character (extends the partial word),
    2 starts with a separator. ``fast``: the token starts clean (normalization never reaches
    back across it); ``fast_after_pending``: also clean after an unfinished UTF-8 character
    (its first byte is not a continuation byte). ``later[j]`` (j = 1..n-1) lists the tokens that
    carry at least j words after their first separator, with ``prefix_part[j]`` the Horner sum of
    their first j-1 such words and ``last_word[j]`` the hash of word j.
    """

    data: list[bytes]
    kind: np.ndarray
    fast: np.ndarray
    fast_after_pending: np.ndarray
    lead_poly: np.ndarray
    later: dict[int, np.ndarray]
    prefix_part: dict[int, np.ndarray]
    last_word: dict[int, np.ndarray]
    inner_ngrams: dict[int, list[list[int]]]  # token -> its own word n-grams (hashes)
    later_by_kind: dict[tuple[int, int], np.ndarray]  # (kind, j) -> later[j] of that kind
    # Tokens that share a word share a lookup (" foo", "(foo" and ".foo" add the word "foo"):
    # the distinct first words of the separator-first tokens and the distinct leading pieces of
    # the word-first ones, with each token's index among them.
    sep_words: np.ndarray
    sep_inverse: np.ndarray
    lead_tokens: np.ndarray
    lead_keys: np.ndarray  # distinct lead_poly values (the merged word depends on nothing else)
    lead_inverse: np.ndarray

    @classmethod
    def build(cls, table: Sequence[bytes | None], ngram_size: int) -> WordVocab:
        size = len(table)
        kind = np.zeros(size, dtype=np.int8)
        fast = np.zeros(size, dtype=bool)
        after_pending = np.zeros(size, dtype=bool)
        lead_poly = np.zeros(size, dtype=np.uint64)
        later_ids: dict[int, list[int]] = {j: [] for j in range(1, ngram_size)}
        prefix_part: dict[int, list[int]] = {j: [] for j in range(1, ngram_size)}
        last_word: dict[int, list[int]] = {j: [] for j in range(1, ngram_size)}
        inner: dict[int, list[list[int]]] = {}
        data = [item or b"" for item in table]
        pattern = word_pattern()
        for token, raw in enumerate(data):
            if not raw:
                continue
            text = raw.decode("utf-8", "replace")
            norm = normalize(text)
            if not norm:
                continue
            clean = starts_clean(text)
            fast[token] = clean
            after_pending[token] = clean and not 0x80 <= raw[0] < 0xC0
            rest = norm
            if is_word_char(norm[0]):
                kind[token] = _LEAD
                lead = pattern.match(norm)
                assert lead is not None
                encoded = lead.group().encode("utf-8")
                lead_poly[token] = word_poly(encoded)
                rest = norm[lead.end() :]
            else:
                kind[token] = _SEPARATOR
            hashes = [_cached_word_hash(word) for word in pattern.findall(rest)]
            running = 0
            for j, value in enumerate(hashes[: ngram_size - 1], start=1):
                later_ids[j].append(token)
                prefix_part[j].append(running)
                last_word[j].append(value)
                running = (running * _M + value + 1) & _MASK64
            if len(hashes) >= ngram_size:
                inner[token] = [
                    hashes[i : i + ngram_size] for i in range(len(hashes) - ngram_size + 1)
                ]
        later = {j: np.asarray(v, dtype=np.int64) for j, v in later_ids.items()}
        by_kind = {
            (which, j): tokens[kind[tokens] == which]
            for j, tokens in later.items()
            for which in (_LEAD, _SEPARATOR)
        }
        separators = by_kind[_SEPARATOR, 1] if ngram_size > 1 else np.zeros(0, dtype=np.int64)
        first_words = (
            np.asarray(last_word[1], dtype=np.uint64)[np.searchsorted(later[1], separators)]
            if ngram_size > 1
            else np.zeros(0, dtype=np.uint64)
        )
        sep_words, sep_inverse = np.unique(first_words, return_inverse=True)
        lead_tokens = np.flatnonzero(kind == _LEAD)
        lead_keys, lead_inverse = np.unique(lead_poly[lead_tokens], return_inverse=True)
        return cls(
            sep_words=sep_words,
            sep_inverse=sep_inverse.reshape(-1),
            lead_tokens=lead_tokens,
            lead_keys=lead_keys,
            lead_inverse=lead_inverse.reshape(-1),
            later_by_kind=by_kind,
            data=data,
            kind=kind,
            fast=fast,
            fast_after_pending=after_pending,
            lead_poly=lead_poly,
            later=later,
            prefix_part={j: np.asarray(v, dtype=np.uint64) for j, v in prefix_part.items()},
            last_word={j: np.asarray(v, dtype=np.uint64) for j, v in last_word.items()},
            inner_ngrams=inner,
        )


@lru_cache(maxsize=1 << 16)
def _cached_word_hash(word: str) -> int:
    return word_hash(word)


# ------------------------------------------------------------------------------------------------
# Per-row text state


def _run_text(run: bytes, tokens: int) -> str:
    """How ``tokenizers`` reads a run of byte-fallback tokens: UTF-8, or U+FFFD per token."""
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * tokens


@dataclass
class RowText:
    """A row's text since a safe cut: bytes, words of its complete reading, partial last word.

    ``head`` holds the bytes of the text (for byte-level tokenizers it may end with ``pending``,
    an unfinished UTF-8 character); ``run`` the bytes of a trailing run of byte-fallback tokens
    (SentencePiece), whose reading is only known once the run ends.
    """

    head: bytes
    pending: bytes
    run: bytes
    run_tokens: int
    hashes: list[int]  # hashes of the complete reading's words (without ``pending``)
    partial: str  # the last word, if the text ends inside it; else ""

    @classmethod
    def of(cls, head: bytes, keep_words: int, run: bytes = b"", run_tokens: int = 0) -> RowText:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(head, final=False)
        pending = decoder.getstate()[0]
        text, head = _trim(text, pending, keep_words)
        if run:
            text += ("\ufffd" if pending else "") + _run_text(run, run_tokens)
        norm = normalize(text)
        found = word_pattern().findall(norm)
        partial = found[-1] if found and is_word_char(norm[-1]) else ""
        hashes = [_cached_word_hash(word) for word in found]
        return cls(head, pending, run, run_tokens, hashes, partial)

    def reading(self, token: bytes = b"", byte_token: bool = False) -> str:
        """The complete text, with ``token`` appended (a byte-fallback token if ``byte_token``)."""
        if byte_token:
            return self.head.decode("utf-8", "replace") + _run_text(
                self.run + token, self.run_tokens + 1
            )
        return (
            self._closed() + token.decode("utf-8", "replace")
            if self.run
            else ((self.head + token).decode("utf-8", "replace"))
        )

    def _closed(self) -> str:
        return self.head.decode("utf-8", "replace") + _run_text(self.run, self.run_tokens)

    def extended(self, token: bytes, keep_words: int, byte_token: bool = False) -> RowText:
        if byte_token:
            return RowText.of(self.head, keep_words, self.run + token, self.run_tokens + 1)
        if not token:
            return self
        if self.run:
            return RowText.of(self._closed().encode("utf-8") + token, keep_words)
        return RowText.of(self.head + token, keep_words)


@lru_cache(maxsize=4096)
def _safe_cut(char: str) -> bool:
    """A cut just before ``char`` splits the words exactly (it starts clean, as a separator)."""
    norm = normalize(char)
    return bool(norm) and starts_clean(char) and not is_word_char(norm[0])


def _trim(text: str, pending: bytes, keep_words: int) -> tuple[str, bytes]:
    """Drop the start of a long text at a safe cut that keeps at least ``keep_words`` words."""
    if len(text) < 8 * keep_words:
        return text, text.encode("utf-8") + pending
    found = len(words(text))
    if found <= 2 * keep_words:
        return text, text.encode("utf-8") + pending
    cut = 0
    for position in range(len(text) // 2, 0, -1):  # the latest safe cut in the first half
        if _safe_cut(text[position]):
            if len(words(text[position:])) >= keep_words:
                cut = position
            break
    text = text[cut:]
    return text, text.encode("utf-8") + pending


_TAIL_CHARS_PER_WORD = 16  # how far back a tail may start, per word it must keep


def _tail(state: RowText, keep_words: int) -> RowText:
    """The row's text from a safe cut near its end that keeps at least ``keep_words`` words.

    A token changes the words of the text at most from the last word on (a UTF-8 character it
    completes, a mark that composes with the last character, the last word it extends), and
    a cut before a clean separator splits the words exactly; so the n-grams a token creates
    are the same in the tail as in the whole text when the tail holds n + 1 words or more.
    """
    if state.run:
        return state
    text = state.head[: len(state.head) - len(state.pending)].decode("utf-8", "replace")
    found, inside, cut = 0, False, 0
    for position in range(len(text) - 1, max(len(text) - _TAIL_CHARS_PER_WORD * keep_words, 0), -1):
        if _safe_cut(text[position]):
            if found >= keep_words:
                cut = position
                break
            inside = False
        elif not inside:  # a word (or what may normalize into one) begins here, reading back
            found, inside = found + 1, True
    if not cut:
        return state
    tail = text[cut:]
    if len(words(tail)) < keep_words:  # the count above is a guess; this is the rule
        return state
    return RowText(tail.encode("utf-8") + state.pending, state.pending, b"", 0, [], "")


@dataclass
class _Plan:
    """One row's step: its text state and words, and which candidates take the fast path."""

    state: RowText
    fast: np.ndarray
    history: list[int]  # hashes of the words of the complete reading (partial word included)
    before: list[int]  # the words before the partial one (all of them when there is none)
    p_poly: int  # the partial word's polynomial and multiplier power (0 and 1 when none)
    p_power: int
    sep_gate: int = -1  # index of this row's context lookups among the step's gates
    lead_gate: int = -1


# ------------------------------------------------------------------------------------------------
# The guard


class MemFreeWordLogitsProcessor(MemFreeLogitsProcessor):
    """Blocks every token after which the row's text would hold a new stored word n-gram.

    Built by ``MemFreeLogitsProcessor(word_filter, tokenizer)``, or directly. Takes the same
    arguments; ``tokenizer`` is required (the guard reads each token's bytes from it). Special
    tokens add no text and are never blocked. Computed on the CPU: the rows' text lives on the
    host, so each step reads the chosen tokens back; the mask goes to the scores' device.
    Statistics work as the token guard's (one record per ``generate()`` call and thread), and
    threads sharing the guard each keep their own rows' text states from step to step.

    Raises:
        FilterMismatchError: the filter is not a word filter, or uses another normalizer.
        UnsupportedTokenizerError: the tokenizer's decoder is not one memfree can read.
    """

    def __init__(self, ngram_filter: Any, tokenizer: Any = None, **kwargs: Any) -> None:
        super().__init__(ngram_filter, tokenizer, **kwargs)
        metadata = self.filter.metadata
        if self.filter.unit != "word":
            raise FilterMismatchError(
                f"{self.filter.path}: is a {self.filter.unit} filter; the word guard needs one "
                "built with `memfree build --unit word`"
            )
        if metadata.get("normalizer") != NORMALIZER:
            raise FilterMismatchError(
                f"{self.filter.path}: words were normalized with {metadata.get('normalizer')!r}, "
                f"this memfree uses {NORMALIZER!r}; rebuild the filter with this version"
            )
        if metadata.get("unicode_version") not in (None, UNICODE_VERSION):
            warnings.warn(
                f"memfree: {self.filter.path} was built with Unicode "
                f"{metadata.get('unicode_version')}, this Python has {UNICODE_VERSION}; words "
                "that use characters added in between may split differently",
                RuntimeWarning,
                stacklevel=2,
            )
        if tokenizer is None:
            raise ValueError(
                "the word guard needs the model's tokenizer (it reads each token's bytes): "
                "MemFreeLogitsProcessor(word_filter, tokenizer=tok)"
            )
        from memfree.vocab_bytes import byte_fallback_ids, token_bytes

        self.tokenizer = tokenizer
        self._table = token_bytes(tokenizer)
        self._byte_ids = byte_fallback_ids(tokenizer)
        self._powers = [pow(_M, k, 1 << 64) for k in range(self.n + 1)]
        self._vocabs: dict[int, WordVocab] = {}
        self._static: dict[int, np.ndarray] = {}
        self._no_text = set(self.special_token_ids)

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

    def blocked_mask(
        self, input_ids: torch.Tensor, vocab_size: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Which tokens would add a stored word n-gram to each row's text.

        Returns:
            (bool `(batch, vocab_size)` mask of blocked tokens, bool `(batch,)` rows where some
            candidate's context could begin a stored n-gram, so candidates were hashed).
        """
        device = torch.device(device or input_ids.device)
        ids_np = input_ids.detach().cpu().numpy().astype(np.int64, copy=False)
        vocab = self.vocab(vocab_size)
        static = self._static[vocab_size]
        batch = ids_np.shape[0]
        mask = np.zeros((batch, vocab_size), dtype=bool)
        checked = np.zeros(batch, dtype=bool)
        # Each thread keeps its own rows' states: threads sharing the guard would otherwise evict
        # each other's (the states are exact for their ids, so any cache gives the same masks).
        previous: dict[bytes, RowText] = getattr(self._local, "rows", {})
        cache: dict[bytes, RowText] = {}
        plans = []
        for row in range(batch):
            state = self._row_text(ids_np[row], previous)
            cache[ids_np[row].tobytes()] = state
            plans.append(self._plan(state, vocab))
        self._local.rows = cache
        # Every row's lookups go to the filter together: one pass per kind of lookup.
        self._fast(plans, vocab, mask, checked)
        for row, plan in enumerate(plans):
            mask[row] |= static & plan.fast
        self._slow(plans, vocab, mask, checked)
        mask[:, [t for t in self._no_text if t < vocab_size]] = False
        result = torch.from_numpy(mask)
        return result.to(device), torch.from_numpy(checked).to(device)

    def _plan(self, state: RowText, vocab: WordVocab) -> _Plan:
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
        return _Plan(state, fast, history, before, p_poly, p_power)

    def _state_of(self, hashes: list[int]) -> int:
        value = self.filter.hash_seed & _MASK64
        for item in hashes:
            value = (value * _M + item + 1) & _MASK64
        return value

    def _fast(
        self, plans: list[_Plan], vocab: WordVocab, mask: np.ndarray, checked: np.ndarray
    ) -> None:
        """The candidates that start clean, for every row, by the token guard's arithmetic."""
        n, power = self.n, self._powers
        # Gates: contexts shared by a whole group of candidates (the last n-1 history words
        # before a separator-first token; the n-1 words before a partial word), looked up once.
        gates: list[int] = []
        for plan in plans:
            plan.sep_gate = plan.lead_gate = -1
            if n > 1 and len(plan.history) >= n - 1:
                plan.sep_gate = len(gates)
                gates.append(
                    fmix64_reference(self._state_of(plan.history[len(plan.history) - (n - 1) :]))
                )
            if n > 1 and len(plan.before) >= n - 1:
                plan.lead_gate = len(gates)
                gates.append(
                    fmix64_reference(self._state_of(plan.before[len(plan.before) - (n - 1) :]))
                )
        open_gate = self._prefix_found(np.asarray(gates, dtype=np.uint64))
        rows: list[np.ndarray] = []
        tokens_list: list[np.ndarray] = []
        fulls: list[np.ndarray] = []
        prefix_at: list[tuple[int, np.ndarray]] = []  # (offset, prefix fingerprints)
        offset = 0

        shared: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # (row, offset, tokens, inverse)

        def add(row: int, tokens: np.ndarray, full: np.ndarray, prefixes: Any) -> None:
            nonlocal offset
            rows.append(np.full(full.shape[0], row, dtype=np.int64))
            tokens_list.append(tokens)
            fulls.append(full)
            if prefixes is not None:
                prefix_at.append((offset, prefixes))
            offset += full.shape[0]
            checked[row] = True

        def add_shared(row: int, tokens: np.ndarray, inverse: np.ndarray, full: np.ndarray) -> None:
            """Lookups of distinct keys; token i's answer is that of key ``inverse[i]``."""
            shared.append((row, offset, tokens, inverse))
            add(row, np.full(full.shape[0], -1, dtype=np.int64), full, None)

        for row, plan in enumerate(plans):
            fast, history, before = plan.fast, plan.history, plan.before
            # Separator-first tokens: new words u_1..u_m after the history H.
            for j in range(1, n):
                if len(history) < n - j:
                    continue
                if j == 1 and not (n == 1 or open_gate[plan.sep_gate]):
                    continue
                tokens = vocab.later_by_kind[_SEPARATOR, j]
                context = np.uint64(
                    self._state_of(history[len(history) - (n - j) :]) * power[j - 1] & _MASK64
                )
                if j == 1 and bool(fast[tokens].all()):  # one lookup per distinct word
                    with np.errstate(over="ignore"):
                        full = _fmix_np(context * np.uint64(_M) + vocab.sep_words + _U1)
                    add_shared(row, tokens, vocab.sep_inverse, full)
                    continue
                tokens = tokens[fast[tokens]]
                if not tokens.size:
                    continue
                where = np.searchsorted(vocab.later[j], tokens)
                if j == 1:
                    base = np.full(tokens.shape[0], context, dtype=np.uint64)
                    prefixes = None
                else:
                    with np.errstate(over="ignore"):
                        base = context + vocab.prefix_part[j][where]
                    prefixes = _fmix_np(base.copy())
                add(row, tokens, self._extend(base, vocab, j, where), prefixes)
            # Word-first tokens: the partial word P becomes P' = P + lead, then u_1..u_m.
            every_lead = bool(fast[vocab.lead_tokens].all())
            if every_lead:  # one lookup per distinct leading piece
                lead = vocab.lead_tokens
                poly = vocab.lead_keys
            else:
                lead = np.flatnonzero((vocab.kind == _LEAD) & fast)
                poly = vocab.lead_poly[lead]
            if not lead.size:
                continue
            with np.errstate(over="ignore"):
                merged_plus = (
                    _fmix_np(
                        np.uint64(plan.p_poly)
                        + np.uint64(plan.p_power) * poly
                        + np.uint64(WORD_OFFSET)
                    )
                    + _U1
                )
            if len(before) >= n - 1 and (n == 1 or open_gate[plan.lead_gate]):
                start = self._state_of(before[len(before) - (n - 1) :] if n > 1 else [])
                with np.errstate(over="ignore"):
                    full = _fmix_np(np.uint64(start) * np.uint64(_M) + merged_plus)
                if every_lead:
                    add_shared(row, lead, vocab.lead_inverse, full)
                else:
                    add(row, lead, full, None)
            if every_lead:
                merged_plus = merged_plus[vocab.lead_inverse]  # per token, for the groups below
            for j in range(1, n):
                if len(before) < n - 1 - j:
                    continue
                candidates = vocab.later_by_kind[_LEAD, j]
                candidates = candidates[fast[candidates]]
                if not candidates.size:
                    continue
                has = np.searchsorted(lead, candidates)  # lead holds every fast word-first token
                where = np.searchsorted(vocab.later[j], candidates)
                start = self._state_of(before[len(before) - (n - 1 - j) :] if n - 1 - j else [])
                with np.errstate(over="ignore"):
                    base = (np.uint64(start) * np.uint64(_M) + merged_plus[has]) * np.uint64(
                        power[j - 1]
                    ) + vocab.prefix_part[j][where]
                prefixes = _fmix_np(base.copy())
                add(row, candidates, self._extend(base, vocab, j, where), prefixes)
        if not tokens_list:
            return
        row_of = np.concatenate(rows)
        tokens = np.concatenate(tokens_list)
        full = np.concatenate(fulls)
        keep = np.ones(tokens.shape[0], dtype=bool)
        if prefix_at:
            found = self._prefix_found(np.concatenate([p for _, p in prefix_at]))
            position = 0
            for start_at, prefixes in prefix_at:
                size = prefixes.shape[0]
                keep[start_at : start_at + size] = found[position : position + size]
                position += size
        hits = np.flatnonzero(keep)[
            sparse_members_np(self.filter.words, full[keep], self.filter.num_probes)
        ]
        own = hits[tokens[hits] >= 0]
        mask[row_of[own], tokens[own]] = True
        if shared:
            hit = np.zeros(full.shape[0], dtype=bool)
            hit[hits] = True
            for row, start_at, group_tokens, inverse in shared:
                mask[row, group_tokens[hit[start_at + inverse]]] = True

    def _extend(self, base: np.ndarray, vocab: WordVocab, j: int, where: np.ndarray) -> np.ndarray:
        """Fingerprints of the n-grams ending at each candidate's j-th new word."""
        with np.errstate(over="ignore"):
            return _fmix_np(base * np.uint64(_M) + vocab.last_word[j][where] + _U1)

    def _prefix_found(self, fingerprints: np.ndarray) -> np.ndarray:
        prefix_words = self.filter.prefix_words
        if prefix_words is None or self.n == 1:
            return np.ones(fingerprints.shape[0], dtype=bool)
        found = np.zeros(fingerprints.shape[0], dtype=bool)
        found[sparse_members_np(prefix_words, fingerprints, self.filter.prefix_num_probes)] = True
        return found

    def _slow(
        self, plans: list[_Plan], vocab: WordVocab, mask: np.ndarray, checked: np.ndarray
    ) -> None:
        """Exact, for the candidates that do not start clean: decode and normalize the row's
        text with each token and compare the words."""
        n = self.n
        ngrams: list[list[str]] = []
        owners: list[tuple[int, int]] = []
        unclean = vocab.kind != _NONE
        for row, plan in enumerate(plans):
            tokens = np.flatnonzero(~plan.fast & unclean)
            if not tokens.size:
                continue
            state = _tail(plan.state, n + 2)
            old = words(state.reading())
            for token in tokens.tolist():
                new = words(state.reading(vocab.data[token], token in self._byte_ids))
                same = 0
                for a, b in zip(old, new, strict=False):
                    if a != b:
                        break
                    same += 1
                for end in range(max(same, n - 1), len(new)):
                    ngrams.append(new[end - n + 1 : end + 1])
                    owners.append((row, token))
                    checked[row] = True
        if not ngrams:
            return
        hits = self.filter.contains(ngram_hash_rows(ngrams))
        found = np.asarray(owners, dtype=np.int64)[hits]
        mask[found[:, 0], found[:, 1]] = True

    def __repr__(self) -> str:
        return (
            f"MemFreeWordLogitsProcessor(filter={str(self.filter.path)!r}, n={self.n}, "
            f"normalizer={NORMALIZER!r}, special_token_ids={list(self.special_token_ids)})"
        )


__all__ = ["MemFreeWordLogitsProcessor", "RowText", "WordVocab"]
