"""The word masker's fast path: every candidate that starts clean, for every row, by the token
guard's arithmetic (a multiply-add from per-row Horner states), all rows' lookups in one pass.

Unicode normalization never reaches back across a token that starts clean
(:func:`~memfree.vocab.words.starts_clean`), so the word n-grams such a candidate creates are the row's
last words followed by the candidate's own: a separator-first token adds words after the row's
history; a word-first token extends the row's partial last word ``P`` first. Tokens that add the
same word share one lookup; the prefix section skips rows whose context begins no stored n-gram.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from memfree.core.row_text import RowText
from memfree.core.word_vocab import LEAD, SEPARATOR, WordVocab
from memfree.filterfile.hashing import (
    HORNER_MULTIPLIER,
    MASK64,
    fingerprint_reference,
    fmix64_np,
    horner_state_reference,
    sparse_members_np,
)
from memfree.filterfile.protocol import BlockedBits
from memfree.vocab.words import WORD_OFFSET

_U1 = np.uint64(1)
_UM = np.uint64(HORNER_MULTIPLIER)


@dataclass
class RowPlan:
    """One row's step: its text state and words, and which candidates take the fast path."""

    state: RowText
    fast: np.ndarray  # bool (vocab,): the candidate starts clean after this row's text
    history: list[int]  # hashes of the words of the complete reading (partial word included)
    before: list[int]  # the words before the partial one (all of them when there is none)
    p_poly: int  # the partial word's polynomial and multiplier power (0 and 1 when none)
    p_power: int
    sep_gate: int = -1  # index of this row's context lookups among the step's gates
    lead_gate: int = -1


@dataclass(frozen=True)
class Lookup:
    """Candidates whose word n-grams are the Horner state ``base`` of their first n-1 words
    (one for all, or one each) followed by a last word's hash (``words``, uint64).

    Attributes:
        gated: the n-gram's first words are not all the row's, so the filter's prefix test
            also applies (a Bloom filter's prefix section).
    """

    base: np.ndarray
    words: np.ndarray
    gated: bool = False


@dataclass(frozen=True)
class WordBits:
    """The filter's side of the fast path for a blocked Bloom filter: its bit arrays, probes,
    seed and n.

    Attributes:
        powers: ``HORNER_MULTIPLIER**k mod 2**64`` for k in 0..n.
    """

    n: int
    bits: BlockedBits
    powers: tuple[int, ...]

    @classmethod
    def of(cls, ngram_size: int, bits: BlockedBits) -> WordBits:
        return cls(ngram_size, bits, horner_powers(ngram_size))

    @property
    def hash_seed(self) -> int:
        return self.bits.hash_seed

    def state_of(self, hashes: Sequence[int]) -> int:
        """The Horner state of a run of word hashes (before the finalizer)."""
        return horner_state_reference(list(hashes), self.hash_seed)

    def prefix_found(self, fingerprints: np.ndarray) -> np.ndarray:
        """Whether each (n-1)-word prefix fingerprint may begin a stored n-gram; bool `(N,)`."""
        prefix_bit_words = self.bits.prefix_bit_words
        if prefix_bit_words is None or self.n == 1:
            return np.ones(fingerprints.shape[0], dtype=bool)
        found = np.zeros(fingerprints.shape[0], dtype=bool)
        found[sparse_members_np(prefix_bit_words, fingerprints, self.bits.prefix_num_probes)] = True
        return found

    def answer(self, lookups: Sequence[Lookup]) -> np.ndarray:
        """Whether each lookup's n-grams may be stored, concatenated; bool."""
        words = np.concatenate([lookup.words for lookup in lookups])
        bases = np.concatenate([np.broadcast_to(lk.base, lk.words.shape) for lk in lookups])
        gated = np.concatenate([np.full(lk.words.shape[0], lk.gated) for lk in lookups])
        with np.errstate(over="ignore"):
            full = fmix64_np(bases * _UM + words + _U1)
        keep = np.ones(words.shape[0], dtype=bool)
        if gated.any():
            keep[gated] = self.prefix_found(fmix64_np(bases[gated]))
        hit = np.zeros(words.shape[0], dtype=bool)
        kept = np.flatnonzero(keep)
        hit[kept[sparse_members_np(self.bits.bit_words, full[keep], self.bits.num_probes)]] = True
        return hit


def horner_powers(ngram_size: int) -> tuple[int, ...]:
    """``HORNER_MULTIPLIER**k mod 2**64`` for k in 0..ngram_size."""
    return tuple(pow(HORNER_MULTIPLIER, k, 1 << 64) for k in range(ngram_size + 1))


class WordSide(Protocol):
    """What the fast path asks of a filter (:class:`WordBits`, or
    :class:`~memfree.core.word_index.WordIndex` for the prefix-keyed index)."""

    @property
    def n(self) -> int: ...

    @property
    def powers(self) -> tuple[int, ...]: ...

    @property
    def hash_seed(self) -> int: ...

    def state_of(self, hashes: Sequence[int]) -> int: ...

    def prefix_found(self, fingerprints: np.ndarray) -> np.ndarray: ...

    def answer(self, lookups: Sequence[Lookup]) -> np.ndarray: ...


class _Lookups:
    """Every row's candidate lookups of one step, answered by the filter together."""

    def __init__(self, checked: np.ndarray) -> None:
        self.checked = checked
        self.rows: list[np.ndarray] = []
        self.tokens: list[np.ndarray] = []
        self.lookups: list[Lookup] = []
        self.shared: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # row, offset, ids, inv
        self.offset = 0

    def add(
        self, row: int, tokens: np.ndarray, base: Any, words: np.ndarray, gated: bool = False
    ) -> None:
        """Candidates ``tokens`` of ``row``, their n-grams the Horner state ``base`` (one, or
        one each) then ``words``; ``gated`` when the n-gram's words past the row's own need the
        filter's prefix test."""
        self.rows.append(np.full(words.shape[0], row, dtype=np.int64))
        self.tokens.append(tokens)
        self.lookups.append(Lookup(np.atleast_1d(np.asarray(base, dtype=np.uint64)), words, gated))
        self.offset += words.shape[0]
        self.checked[row] = True

    def add_shared(
        self, row: int, tokens: np.ndarray, inverse: np.ndarray, base: Any, words: np.ndarray
    ) -> None:
        """Lookups of distinct words; token i's answer is that of word ``inverse[i]``."""
        self.shared.append((row, self.offset, tokens, inverse))
        self.add(row, np.full(words.shape[0], -1, dtype=np.int64), base, words)

    def resolve(self, side: WordSide, mask: np.ndarray) -> None:
        """Query the filter once for every lookup and set the hits in ``mask`` (rows, vocab)."""
        if not self.tokens:
            return
        row_of = np.concatenate(self.rows)
        tokens = np.concatenate(self.tokens)
        hit = side.answer(self.lookups)
        hits = np.flatnonzero(hit)
        own = hits[tokens[hits] >= 0]
        mask[row_of[own], tokens[own]] = True
        for row, start_at, group_tokens, inverse in self.shared:
            mask[row, group_tokens[hit[start_at + inverse]]] = True


def fast_mask(
    plans: list[RowPlan],
    vocab: WordVocab,
    word_bits: WordSide,
    mask: np.ndarray,
    checked: np.ndarray,
) -> None:
    """Set in ``mask`` (rows, vocab) every fast candidate that creates a stored word n-gram.

    ``checked`` (rows,) becomes True for rows where some candidate was hashed.
    """
    open_gate = _gates(plans, word_bits)
    lookups = _Lookups(checked)
    for row, plan in enumerate(plans):
        _separator_first(row, plan, vocab, word_bits, open_gate, lookups)
        _word_first(row, plan, vocab, word_bits, open_gate, lookups)
    lookups.resolve(word_bits, mask)


def _gates(plans: list[RowPlan], word_bits: WordSide) -> np.ndarray:
    """Contexts shared by a whole group of candidates (the last n-1 history words before a
    separator-first token; the n-1 words before a partial word), looked up once per row."""
    n, seed = word_bits.n, word_bits.hash_seed
    gates: list[int] = []
    for plan in plans:
        plan.sep_gate = plan.lead_gate = -1
        if n > 1 and len(plan.history) >= n - 1:
            plan.sep_gate = len(gates)
            gates.append(fingerprint_reference(plan.history[len(plan.history) - (n - 1) :], seed))
        if n > 1 and len(plan.before) >= n - 1:
            plan.lead_gate = len(gates)
            gates.append(fingerprint_reference(plan.before[len(plan.before) - (n - 1) :], seed))
    return word_bits.prefix_found(np.asarray(gates, dtype=np.uint64))


def _separator_first(
    row: int,
    plan: RowPlan,
    vocab: WordVocab,
    word_bits: WordSide,
    open_gate: np.ndarray,
    lookups: _Lookups,
) -> None:
    """Separator-first tokens: new words u_1..u_m after the row's history H."""
    n, fast, history = word_bits.n, plan.fast, plan.history
    for j in range(1, n):
        if len(history) < n - j:
            continue
        if j == 1 and not (n == 1 or open_gate[plan.sep_gate]):
            continue
        tokens = vocab.later_by_kind[SEPARATOR, j]
        state = word_bits.state_of(history[len(history) - (n - j) :])
        context = np.uint64(state * word_bits.powers[j - 1] & MASK64)
        if j == 1 and bool(fast[tokens].all()):  # one lookup per distinct word
            lookups.add_shared(row, tokens, vocab.sep_inverse, context, vocab.sep_words)
            continue
        tokens = tokens[fast[tokens]]
        if not tokens.size:
            continue
        where = np.searchsorted(vocab.later[j], tokens)
        if j == 1:
            lookups.add(row, tokens, context, vocab.last_word[j][where])
        else:
            with np.errstate(over="ignore"):
                base = context + vocab.prefix_part[j][where]
            lookups.add(row, tokens, base, vocab.last_word[j][where], gated=True)


def _word_first(
    row: int,
    plan: RowPlan,
    vocab: WordVocab,
    word_bits: WordSide,
    open_gate: np.ndarray,
    lookups: _Lookups,
) -> None:
    """Word-first tokens: the partial word P becomes P' = P + lead, then u_1..u_m."""
    n, fast, before = word_bits.n, plan.fast, plan.before
    every_lead = bool(fast[vocab.lead_tokens].all())
    if every_lead:  # one lookup per distinct leading piece
        lead, poly = vocab.lead_tokens, vocab.lead_keys
    else:
        lead = np.flatnonzero((vocab.kind == LEAD) & fast)
        poly = vocab.lead_poly[lead]
    if not lead.size:
        return
    with np.errstate(over="ignore"):
        merged = np.uint64(plan.p_poly) + np.uint64(plan.p_power) * poly + np.uint64(WORD_OFFSET)
    merged_word = fmix64_np(merged)  # the hash of the partial word with the leading piece
    if len(before) >= n - 1 and (n == 1 or open_gate[plan.lead_gate]):
        start = word_bits.state_of(before[len(before) - (n - 1) :] if n > 1 else [])
        if every_lead:
            lookups.add_shared(row, lead, vocab.lead_inverse, start, merged_word)
        else:
            lookups.add(row, lead, start, merged_word)
    if every_lead:
        merged_word = merged_word[vocab.lead_inverse]  # per token, for the groups below
    for j in range(1, n):
        if len(before) < n - 1 - j:
            continue
        candidates = vocab.later_by_kind[LEAD, j]
        candidates = candidates[fast[candidates]]
        if not candidates.size:
            continue
        has = np.searchsorted(lead, candidates)  # lead holds every fast word-first token
        where = np.searchsorted(vocab.later[j], candidates)
        start = word_bits.state_of(before[len(before) - (n - 1 - j) :] if n - 1 - j else [])
        with np.errstate(over="ignore"):
            base = (np.uint64(start) * _UM + merged_word[has] + _U1) * np.uint64(
                word_bits.powers[j - 1]
            ) + vocab.prefix_part[j][where]
        lookups.add(row, candidates, base, vocab.last_word[j][where], gated=True)


__all__ = ["Lookup", "RowPlan", "WordBits", "WordSide", "fast_mask", "horner_powers"]
