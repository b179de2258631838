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
class WordBits:
    """The filter's side of the fast path: its bit arrays, probes, seed and n.

    Attributes:
        powers: ``HORNER_MULTIPLIER**k mod 2**64`` for k in 0..n.
    """

    n: int
    bits: BlockedBits
    powers: tuple[int, ...]

    @classmethod
    def of(cls, ngram_size: int, bits: BlockedBits) -> WordBits:
        powers = tuple(pow(HORNER_MULTIPLIER, k, 1 << 64) for k in range(ngram_size + 1))
        return cls(ngram_size, bits, powers)

    def state_of(self, hashes: Sequence[int]) -> int:
        """The Horner state of a run of word hashes (before the finalizer)."""
        return horner_state_reference(list(hashes), self.bits.hash_seed)

    def prefix_found(self, fingerprints: np.ndarray) -> np.ndarray:
        """Whether each (n-1)-word prefix fingerprint may begin a stored n-gram; bool `(N,)`."""
        prefix_bit_words = self.bits.prefix_bit_words
        if prefix_bit_words is None or self.n == 1:
            return np.ones(fingerprints.shape[0], dtype=bool)
        found = np.zeros(fingerprints.shape[0], dtype=bool)
        found[sparse_members_np(prefix_bit_words, fingerprints, self.bits.prefix_num_probes)] = True
        return found


class _Lookups:
    """Every row's candidate fingerprints of one step, answered by the filter together."""

    def __init__(self, checked: np.ndarray) -> None:
        self.checked = checked
        self.rows: list[np.ndarray] = []
        self.tokens: list[np.ndarray] = []
        self.fulls: list[np.ndarray] = []
        self.prefix_at: list[tuple[int, np.ndarray]] = []  # (offset, prefix fingerprints)
        self.shared: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # row, offset, ids, inv
        self.offset = 0

    def add(
        self, row: int, tokens: np.ndarray, full: np.ndarray, prefixes: np.ndarray | None
    ) -> None:
        """Candidates ``tokens`` of ``row`` with n-gram fingerprints ``full`` (and, when the
        n-gram's words past the row's own need it, their prefix fingerprints)."""
        self.rows.append(np.full(full.shape[0], row, dtype=np.int64))
        self.tokens.append(tokens)
        self.fulls.append(full)
        if prefixes is not None:
            self.prefix_at.append((self.offset, prefixes))
        self.offset += full.shape[0]
        self.checked[row] = True

    def add_shared(
        self, row: int, tokens: np.ndarray, inverse: np.ndarray, full: np.ndarray
    ) -> None:
        """Lookups of distinct keys; token i's answer is that of key ``inverse[i]``."""
        self.shared.append((row, self.offset, tokens, inverse))
        self.add(row, np.full(full.shape[0], -1, dtype=np.int64), full, None)

    def resolve(self, word_bits: WordBits, mask: np.ndarray) -> None:
        """Query the filter once for every lookup and set the hits in ``mask`` (rows, vocab)."""
        if not self.tokens:
            return
        row_of = np.concatenate(self.rows)
        tokens = np.concatenate(self.tokens)
        full = np.concatenate(self.fulls)
        keep = np.ones(tokens.shape[0], dtype=bool)
        if self.prefix_at:
            found = word_bits.prefix_found(np.concatenate([p for _, p in self.prefix_at]))
            position = 0
            for start_at, prefixes in self.prefix_at:
                size = prefixes.shape[0]
                keep[start_at : start_at + size] = found[position : position + size]
                position += size
        bits = word_bits.bits
        hits = np.flatnonzero(keep)[sparse_members_np(bits.bit_words, full[keep], bits.num_probes)]
        own = hits[tokens[hits] >= 0]
        mask[row_of[own], tokens[own]] = True
        if self.shared:
            hit = np.zeros(full.shape[0], dtype=bool)
            hit[hits] = True
            for row, start_at, group_tokens, inverse in self.shared:
                mask[row, group_tokens[hit[start_at + inverse]]] = True


def fast_mask(
    plans: list[RowPlan],
    vocab: WordVocab,
    word_bits: WordBits,
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


def _gates(plans: list[RowPlan], word_bits: WordBits) -> np.ndarray:
    """Contexts shared by a whole group of candidates (the last n-1 history words before a
    separator-first token; the n-1 words before a partial word), looked up once per row."""
    n, seed = word_bits.n, word_bits.bits.hash_seed
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
    word_bits: WordBits,
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
            with np.errstate(over="ignore"):
                full = fmix64_np(context * _UM + vocab.sep_words + _U1)
            lookups.add_shared(row, tokens, vocab.sep_inverse, full)
            continue
        tokens = tokens[fast[tokens]]
        if not tokens.size:
            continue
        where = np.searchsorted(vocab.later[j], tokens)
        prefixes = None
        if j == 1:
            base = np.full(tokens.shape[0], context, dtype=np.uint64)
        else:
            with np.errstate(over="ignore"):
                base = context + vocab.prefix_part[j][where]
            prefixes = fmix64_np(base)
        lookups.add(row, tokens, _extend(base, vocab, j, where), prefixes)


def _word_first(
    row: int,
    plan: RowPlan,
    vocab: WordVocab,
    word_bits: WordBits,
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
        merged_plus = fmix64_np(merged) + _U1  # the merged word's hash, + 1 as Horner adds it
    if len(before) >= n - 1 and (n == 1 or open_gate[plan.lead_gate]):
        start = word_bits.state_of(before[len(before) - (n - 1) :] if n > 1 else [])
        with np.errstate(over="ignore"):
            full = fmix64_np(np.uint64(start) * _UM + merged_plus)
        if every_lead:
            lookups.add_shared(row, lead, vocab.lead_inverse, full)
        else:
            lookups.add(row, lead, full, None)
    if every_lead:
        merged_plus = merged_plus[vocab.lead_inverse]  # per token, for the groups below
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
            base = (np.uint64(start) * _UM + merged_plus[has]) * np.uint64(
                word_bits.powers[j - 1]
            ) + vocab.prefix_part[j][where]
        lookups.add(row, candidates, _extend(base, vocab, j, where), fmix64_np(base))


def _extend(base: np.ndarray, vocab: WordVocab, j: int, where: np.ndarray) -> np.ndarray:
    """Fingerprints of the n-grams ending at each candidate's j-th new word."""
    with np.errstate(over="ignore"):
        return fmix64_np(base * _UM + vocab.last_word[j][where] + _U1)


__all__ = ["RowPlan", "WordBits", "fast_mask"]
