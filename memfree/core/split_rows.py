"""A split pattern's banned rows, from parts that states share: the canonical masker's fills.

A split state (:mod:`memfree.core.canonical_split`: a row's last chunks' shape, its last token
``a``, the facts its groups read, and its fixes) reads ``a`` only through the merge-tree test
after it, and each candidate reads that test at its own index: a token at itself, a pseudo
candidate (:mod:`memfree.core.canonical_chars`) at its head, which is where the head is allowed.
So, candidate by candidate, the answer is an "or" of routes that do not read the test (a chunk
of its own, an added token) and routes that need it to pass (a chunk that goes on). With ``J``
the tokens the test fails after ``a`` (:meth:`~memfree.vocab.bpe.ByteLevelBpe.joined`), the
banned row is ``banned | (J & tested)``: ``banned``, what no route allows with the test passing
everywhere; ``tested``, what only the test's routes allow. Both are kept per state *without*
``a`` and without the row's fixes, so states that differ only there share them: most of a step's
new states, whose rows then cost the test's failures, not a pass per group over the vocabulary.

A row's fixes (:meth:`~memfree.core.canonical_split.SplitChunks.bans`: its NFC context, the
last character for Qwen 2; a continued chunk's text, for ``ignore_merges``) only ban: tokens,
and pseudo candidates. A head banned as a token may still be allowed through a pseudo
candidate, and a head's pseudo candidate banned may leave another, so at the indexes they reach
the answer is made again from the routes, kept apart in the parts (the tokens' and the pseudo
candidates', each with and without the test).

Exact: equal to the masker's own answer (:meth:`CanonicalMasker._allowed
<memfree.core.canonical.CanonicalMasker>`), which is tested against it state by state.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memfree.core.canonical_chars import Characters
from memfree.core.canonical_split import SplitChunks
from memfree.vocab.bpe import ByteLevelBpe
from memfree.vocab.pair_ranges import expand_runs

_KEPT = 256  # parts kept (per state without its last token and its fixes)
_KEPT_SITES = 1024  # where NFC contexts reach, kept (per contexts)
_FEW_SITES = 16  # indexes past which the merge-tree test is read from its failures
_BIT = np.array([0x80 >> shift for shift in range(8)], dtype=np.uint8)  # np.packbits' order


@dataclass(frozen=True, eq=False)
class _Parts:
    """One state's routes without its last token, packed 8 candidates a byte (``np.packbits``)."""

    banned: np.ndarray  # no route allows it (the test passing everywhere)
    tested: np.ndarray  # only routes that need the test allow it
    alone: np.ndarray  # the tokens' routes that do not read the test
    merged: np.ndarray  # the tokens' routes that need it
    pseudo_alone: np.ndarray  # bool (K,): the pseudo candidates' (not packed)
    pseudo_merged: np.ndarray


@dataclass(frozen=True, eq=False)
class _Sites:
    """Where a row's fixes reach, without its last token: the indexes, and the routes there
    that do not read the test."""

    at: np.ndarray  # int64, sorted, distinct: the tokens banned and the banned pseudo heads
    free: np.ndarray  # bool: at each, the token itself is not banned by the fixes
    pseudo: np.ndarray  # int64: the pseudo candidates not banned whose head is in ``at``
    owner: np.ndarray  # int64: for each, the index of its head in ``at``


class SplitRows:
    """Banned rows of split states from shared parts.

    Args:
        bpe: the tokenizer's tables.
        split: its split pattern's rules.
        chars: its characters written with several tokens (their pseudo candidates).
        added: bool `(vocab_size,)`: added tokens that are not special (allowed where the row
            may be cut).
        starting_with: ``starting_with(text)``: bool `(vocab_size,)`, the tokens whose text
            starts with ``text`` (they would finish an added token's content a row began).
    """

    def __init__(
        self,
        bpe: ByteLevelBpe,
        split: SplitChunks,
        chars: Characters | None,
        added: np.ndarray,
        starting_with: Callable[[str], np.ndarray],
    ) -> None:
        self.bpe = bpe
        self.split = split
        self.size = bpe.vocab_size
        self.chars = chars if chars is not None and chars.size else None
        self._added = added
        self._starting_with = starting_with
        self._parts: OrderedDict[Hashable, _Parts] = OrderedDict()
        self._lock = threading.Lock()
        self._sites: OrderedDict[Hashable, _Sites | None] = OrderedDict()
        self._fails = np.zeros(self.size, dtype=bool)  # scratch rows (all False between uses)
        self._marked = np.zeros(self.size, dtype=bool)
        if self.chars is not None:  # the pseudo candidates by head, and the heads sorted
            order = np.argsort(self.chars.heads, kind="stable")
            self._by_head = (order, self.chars.heads[order])

    def fill(self, row: np.ndarray, key: tuple[Any, ...]) -> bool:
        """Writes the candidates below the vocabulary's size that a split state ``key``
        (``("split", key, pending, fixes)``) bans into ``row``; returns whether it allows any."""
        _, state, pending, fixes = key
        parts = self._parts_of(state, pending)
        size = self.size
        row[:size] = np.unpackbits(parts.banned, count=size).view(bool)
        joined = self.bpe.joined(state[1])
        row[joined[_bits(parts.tested, joined)]] = True
        if fixes:
            self._fixed(row, state, fixes, parts, joined)
        return not row[:size].all()

    def _fixed(
        self,
        row: np.ndarray,
        state: tuple[Any, ...],
        fixes: tuple[Any, ...],
        parts: _Parts,
        joined: np.ndarray,
    ) -> None:
        """The answer again at the indexes a row's fixes reach (:meth:`SplitChunks.bans
        <memfree.core.canonical_split.SplitChunks.bans>`: the tokens they ban, and the heads
        of the pseudo candidates they ban), from the routes: a token's own, unless banned, or
        one of its pseudo candidates', unless banned. Fixes that are NFC contexts alone (Qwen
        2's rows) reach indexes kept per context (:meth:`_fixed_at`); a continued chunk's
        text (``ignore_merges``) seldom repeats, so those fixes are answered afresh."""
        if fixes and all(number < 0 for number, _ in fixes):
            sites = self._sites_of(fixes)
            if sites is not None:
                self._fixed_at(row, state[1], sites, parts, joined)
            return
        tokens = self.split.bans(state, fixes)
        chars = self.chars
        pseudo = self.split.bans_pseudo(state, fixes) if chars is not None else tokens[:0]
        if not tokens.size and not pseudo.size:
            return
        with self._lock:  # scratch rows, cleared after use
            fails, marked = self._fails, self._marked
            fails[joined] = True  # the merge-tree test after the last token fails
            marked[tokens] = True
            at = tokens
            if chars is not None and pseudo.size:
                at = np.concatenate([tokens, chars.heads[pseudo]])
            allowed = ~marked[at] & (
                _bits(parts.alone, at) | (_bits(parts.merged, at) & ~fails[at])
            )
            marked[tokens] = False
            if chars is not None:
                heads = chars.heads
                ok = parts.pseudo_alone | (parts.pseudo_merged & ~fails[heads])
                ok[pseudo] = False
                marked[heads[ok]] = True
                allowed |= marked[at]
                marked[heads[ok]] = False
            fails[joined] = False
        row[at] = ~allowed

    def _fixed_at(
        self, row: np.ndarray, a: int, sites: _Sites, parts: _Parts, joined: np.ndarray
    ) -> None:
        """:meth:`_fixed` at the indexes NFC contexts reach (a few: one to three on the bench's
        rows, kept per context), the merge-tree test after the last token ``a`` read at those
        indexes alone."""
        at = sites.at
        if at.size <= _FEW_SITES:  # the test at each index: a binary search, no row
            passing = self.bpe.pair_allowed
            passes = np.array([passing(a, t) for t in at.tolist()], dtype=bool)
        else:  # from the test's failures, marked in a scratch row (cleared after use)
            with self._lock:
                self._fails[joined] = True
                passes = ~self._fails[at]
                self._fails[joined] = False
        allowed = sites.free & (_bits(parts.alone, at) | (_bits(parts.merged, at) & passes))
        pseudo = sites.pseudo
        if pseudo.size:  # a head allowed through one of its pseudo candidates the fixes leave
            ok = parts.pseudo_alone[pseudo] | (parts.pseudo_merged[pseudo] & passes[sites.owner])
            allowed[sites.owner[ok]] = True
        row[at] = ~allowed

    def _sites_of(self, fixes: tuple[Any, ...]) -> _Sites | None:
        """Where NFC contexts reach (None: nowhere), kept per contexts: what they ban reads
        neither the state's shape nor its facts."""
        with self._lock:
            if fixes in self._sites:
                self._sites.move_to_end(fixes)
                return self._sites[fixes]
        tokens = np.sort(
            np.concatenate([self.split.breaking_nfc(text, pseudo=False) for _, text in fixes])
        )
        chars = self.chars
        banned = tokens[:0]
        if chars is not None:
            banned = np.concatenate([self.split.breaking_nfc(t, pseudo=True) for _, t in fixes])
        sites = None
        if tokens.size or banned.size:
            at = tokens
            if chars is not None and banned.size:
                at = np.sort(np.concatenate([tokens, chars.heads[banned]]))
            if at.size > 1:  # distinct
                at = at[np.concatenate(([True], at[1:] != at[:-1]))]
            pseudo = owner = np.zeros(0, dtype=np.int64)
            if chars is not None:  # the pseudo candidates whose head is in ``at``
                order, heads = self._by_head
                lo = np.searchsorted(heads, at, side="left")
                counts = np.searchsorted(heads, at, side="right") - lo
                owner = np.repeat(np.arange(len(at)), counts)
                pseudo = order[expand_runs(lo, counts)]
                left = ~_member(np.sort(banned), pseudo)
                pseudo, owner = pseudo[left], owner[left]
            sites = _Sites(at, ~_member(tokens, at), pseudo, owner)
        with self._lock:
            self._sites[fixes] = sites
            if len(self._sites) > _KEPT_SITES:
                self._sites.popitem(last=False)
        return sites

    def _parts_of(self, state: tuple[Any, ...], pending: tuple[str, ...]) -> _Parts:
        shape, _, facts, ends = state
        base = (shape, facts, ends, pending)
        with self._lock:
            known = self._parts.get(base)
            if known is not None:
                self._parts.move_to_end(base)
                return known
        alone, merged = self.split.mask_parts(state)
        if ends:  # the row may be cut here: an added token may follow
            alone = alone | self._added
        for rest in pending:  # nothing may finish an added token's content the row began
            begun = self._starting_with(rest)
            alone &= ~begun
            merged &= ~begun
        everywhere, untested = alone.copy(), alone.copy()
        everywhere |= merged
        chars = self.chars
        if chars is not None:
            pseudo_alone, pseudo_merged = self.split.mask_pseudo_parts(state)
            for rest in pending:
                begun = chars.starting_with(rest)
                pseudo_alone &= ~begun
                pseudo_merged &= ~begun
            untested[chars.heads[pseudo_alone]] = True
            everywhere[chars.heads[pseudo_alone | pseudo_merged]] = True
        else:
            pseudo_alone = pseudo_merged = np.zeros(0, dtype=bool)
        parts = _Parts(
            np.packbits(~everywhere),
            np.packbits(everywhere & ~untested),
            np.packbits(alone),
            np.packbits(merged),
            pseudo_alone,
            pseudo_merged,
        )
        with self._lock:
            self._parts[base] = parts
            if len(self._parts) > _KEPT:
                self._parts.popitem(last=False)
        return parts

    @property
    def nbytes(self) -> int:
        """The bytes the kept parts hold."""
        with self._lock:
            kept = list(self._parts.values())
        return sum(
            p.banned.nbytes + p.tested.nbytes + p.alone.nbytes + p.merged.nbytes
            + p.pseudo_alone.nbytes + p.pseudo_merged.nbytes
            for p in kept
        )  # fmt: skip


def _member(values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """bool: whether each of ``queries`` is in ``values`` (sorted)."""
    if not values.size:
        return np.zeros(len(queries), dtype=bool)
    where = np.minimum(np.searchsorted(values, queries), len(values) - 1)
    return values[where] == queries


def _bits(packed: np.ndarray, indexes: np.ndarray) -> np.ndarray:
    """bool: the bits of a packed row (``np.packbits``' order) at ``indexes``."""
    return (packed[indexes >> 3] & _BIT[indexes & 7]) != 0


__all__ = ["SplitRows"]
