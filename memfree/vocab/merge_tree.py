"""A BPE model's merges as trees: which token may follow which with no merge across the junction.

Hugging Face ``tokenizers`` applies a BPE model's merges lowest rank first, leftmost among
equals, to a word's symbols (bytes for byte-level BPE; characters, or the bytes of a character
the vocabulary lacks, for SentencePiece-style BPE with byte fallback). A token sequence is BPE's
own for its text exactly when every adjacent pair is (Vieira et al., "Language Models over
Canonical Byte-Pair Encodings", ICML 2025), and a pair ``[a, b]`` is, for tokens BPE gives back
alone, exactly when no merge fires across their junction: :meth:`MergeTree.bigram_allowed`
reads that from the two tokens' merge trees, for every ``b`` at once. Byte-level BPE
(:mod:`memfree.vocab.bpe`) and SentencePiece-style BPE (:mod:`memfree.vocab.sentencepiece`)
both read their pairs here.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memfree.vocab.pair_ranges import (
    LatePairs,
    PairRanges,
    expand_runs,
    narrowed_state,
    pair_ranges,
    widened_state,
)

_INF = np.iinfo(np.int64).max
_LATE_PAIRS = 1 << 16  # pairs read from the merges, kept (cleared when full)


@dataclass(frozen=True, eq=False)
class MergeTree:
    """The merge trees of one BPE model (build with :meth:`of`).

    Attributes:
        size: ids the tokenizer can produce (tokens past the model's vocabulary have no tree).
        vocab: the model's vocabulary: token string (as the model writes it) -> id.
        merges: the model's merges, as its JSON writes them.
        left, right: int64 `(size,)`: each merged token's children (-1: a leaf, never made).
        made_at: int64 `(size,)`: the rank of the merge that makes the token (max int: a leaf).
        partners: the merges by left symbol, CSR: offsets, right symbol, rank.
        members: for each symbol, the tokens whose left spine holds it, CSR: offsets, token, and
            the rank of the merge that consumes the symbol there.
        late: bool `(size,)` twice: tokens with a late node on their right / left spine.
        ranges: every token's conflicts written down ahead (:mod:`memfree.vocab.pair_ranges`;
            None: read per token from the merges).
        late_pairs: the columns of tokens with a late node on their left spine, read from the
            merges once for every token (None: read per token, or there are none).
        late_rows: the rows of tokens with a late node on their right spine, read from the
            merges once each, packed (``np.packbits``; None: read on first use).
    """

    size: int
    vocab: dict[str, int]
    merges: list[Any]
    left: np.ndarray
    right: np.ndarray
    made_at: np.ndarray
    partners: tuple[np.ndarray, np.ndarray, np.ndarray]
    members: tuple[np.ndarray, np.ndarray, np.ndarray]
    late: tuple[np.ndarray, np.ndarray]
    byte_fallback: bool = False  # the model writes a character it lacks as byte tokens
    ranges: PairRanges | None = None
    late_pairs: LatePairs | None = None
    late_rows: dict[int, np.ndarray] | None = None
    _merges_only: list[Any] = field(default_factory=list)  # the model without ignore_merges
    _late_rows: dict[int, np.ndarray] = field(default_factory=dict)  # late tokens' answers
    _late_pairs: dict[tuple[int, int], bool] = field(default_factory=dict)  # read from merges

    @classmethod
    def of(
        cls, vocab: dict[str, int], merges: list[Any], size: int, *, byte_fallback: bool = False
    ) -> MergeTree:
        """The trees of a model's vocabulary and merges (ids from ``size`` on are left out)."""
        left, right, made_at, partners = _merge_tree(merges, vocab, size)
        members = _left_spines(left, made_at, size)
        late = _late_spines(left, right, made_at)
        ranges = pair_ranges(left, right, made_at, partners, late[0])
        tree = cls(
            size, vocab, merges, left, right, made_at, partners, members, late, byte_fallback,
            ranges,
        )  # fmt: skip
        if late[0].any() or (ranges is not None and late[1].any()):
            tree = dataclasses.replace(
                tree,
                late_pairs=tree._late_pairs_ahead() if ranges is not None else None,
                late_rows=tree._late_rows_ahead(),
            )
        return tree

    def _late_rows_ahead(self) -> dict[int, np.ndarray]:
        """:attr:`late_rows`: the row of each token with a late node on its right spine, read
        from the merges (Llama 2's 14 runs of spaces, 30,000 pairs each, 2 s once; Llama 3's
        101 tokens, 1.0 million pairs, 5 s once: a row met first in a step would stall it)."""
        late = np.flatnonzero(self.late[0]).tolist()
        return {a: np.packbits(self._late_row(a, memo=False)) for a in late}

    def _late_row(self, a: int, memo: bool) -> np.ndarray:
        """:meth:`bigram_allowed` of a token with a late node on its right spine, read from the
        merges where some merge meets the junction (``memo``: each pair kept, as
        :meth:`_bigram_by_merges` keeps them)."""
        kept = np.ones(self.size, dtype=bool)
        near = self._meeting(a)
        known = self._late_pairs if memo else None
        kept[near] = _merged_pairs(self.merges_model, self.strings, a, near, known)
        return kept

    def _late_pairs_ahead(self) -> LatePairs:
        """:attr:`late_pairs`: :meth:`_late_near` of every token and the merges' answer for
        each pair (Llama 3: about 800,000 pairs, 6 s once; the tables are kept on disk)."""
        counts = np.zeros(self.size + 1, dtype=np.int64)
        tokens: list[np.ndarray] = []
        joins: list[np.ndarray] = []
        model, strings = self.merges_model, self.strings
        for a in range(self.size):
            if self.late[0][a]:
                continue
            near = self._late_near(a)
            if near.size:
                counts[a + 1] = near.size
                tokens.append(near)
                joins.append(~_merged_pairs(model, strings, a, near))
        empty = np.zeros(0, dtype=np.int64)
        return LatePairs(
            np.cumsum(counts),
            np.concatenate(tokens or [empty]).astype(np.int32),
            np.concatenate(joins or [empty.astype(bool)]),
        )

    def bigram_allowed(self, a: int) -> np.ndarray:
        """bool `(vocab_size,)`: BPE gives ``[a, b]`` back for the bytes of ``a`` then ``b``
        (for every ``b`` BPE gives back alone; the caller checks that).

        A merge across the junction fires iff some x on ``a``'s right spine and y on ``b``'s
        left spine form a merge of rank r while both stand there: r < cons(x) and r <= cons(y)
        (cons: the rank of the merge that consumes the symbol in its tree), and their lives
        meet: form(y) < cons(x) and form(x) <= cons(y) (form: the rank that makes it; a byte
        is there from the start). Merges are applied in increasing rank, leftmost first among
        equals. In a vocabulary trained by BPE every merge comes after the merges that make
        its parts, and the second pair of conditions always holds; a vocabulary converted from
        tiktoken's ranks (Llama 3) has merges whose parts are made later. There the rule is
        exact wherever each node on the two spines is made no earlier than the nodes under it
        (a symbol's life is then the span between those ranks; the proof is in
        docs/canonical.md); the few tokens with a later-made node on a spine are read from the
        merges themselves.
        """
        if self.late[0][a]:  # read from the merges: only where some merge meets the junction
            if self.late_rows is not None and a in self.late_rows:  # read at build
                return np.unpackbits(self.late_rows[a], count=self.size).view(bool)
            kept = self._late_rows.get(a)  # few tokens (runs of spaces), each read once
            if kept is None:
                kept = self._late_rows[a] = self._late_row(a, memo=True)
            return kept.copy()
        if self.ranges is not None:
            allowed = np.ones(self.size, dtype=bool)
            allowed[self.ranges.conflicts(a)] = False
        else:
            allowed = ~self.conflicts_by_spine(a)
        late, joins = self._late_columns(a)
        allowed[late] = ~joins  # read from the merges, where some merge meets the junction
        return allowed

    def joined(self, a: int) -> np.ndarray:
        """int64: the tokens where :meth:`bigram_allowed` is False (a merge would join them to
        ``a``), in no order and without repeats, without the row: from ``a``'s runs where
        both spines are early."""
        if self.ranges is None or self.late[0][a]:
            return np.flatnonzero(~self.bigram_allowed(a))
        late, joins = self._late_columns(a)
        if not late.size:
            return self.ranges.conflicts(a).astype(np.int64, copy=False)
        found = self.ranges.conflicts_without(a, late)  # the late columns replaced
        return np.concatenate([found.astype(np.int64), late[joins]])

    def pair_allowed(self, a: int, b: int) -> bool:
        """``bigram_allowed(a)[b]``, without the row: a binary search over ``a``'s runs where
        both tokens' spines are early (the rest read as :meth:`bigram_allowed` reads them)."""
        if self.ranges is None or self.late[0][a]:
            return bool(self.bigram_allowed(a)[b])
        if self.late[1][b]:
            late, joins = self._late_columns(a)
            at = np.flatnonzero(late == b)
            if at.size:
                return not bool(joins[at[0]])
        return not self.ranges.joins(a, b)

    def _late_columns(self, a: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_late_near` of ``a`` and whether a merge joins each to ``a``: written down
        ahead (:attr:`late_pairs`), or read from the merges."""
        if self.late_pairs is not None and not self.late[0][a]:
            return self.late_pairs.of(a)
        late = self._late_near(a)
        if not late.size:
            return late, np.zeros(0, dtype=bool)
        return late, ~self._bigram_by_merges(a, late)

    def _late_near(self, a: int) -> np.ndarray:
        """The tokens with a late node on their left spine that some merge joins to a symbol
        on ``a``'s right spine (whatever the ranks): the columns :meth:`bigram_allowed` reads
        from the merges."""
        by_partner = self._late_by_partner
        if not by_partner:
            return np.zeros(0, dtype=np.int64)
        found = [by_partner[x] for x, _ in self.right_spine(a) if x in by_partner]
        return distinct(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)

    @functools.cached_property
    def _late_by_partner(self) -> dict[int, np.ndarray]:
        """Symbol x -> the tokens with a late node on their left spine that hold a symbol y
        with a merge (x, y)."""
        owners, symbols = self._late_left_spines
        if not owners.size:
            return {}
        offsets, partner, _ = self.partners
        lefts = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
        holders: dict[int, list[int]] = {}
        for owner, symbol in zip(owners.tolist(), symbols.tolist(), strict=True):
            holders.setdefault(symbol, []).append(owner)
        near = np.isin(partner, list(holders))
        found: dict[int, set[int]] = {}
        for x, y in zip(lefts[near].tolist(), partner[near].tolist(), strict=True):
            found.setdefault(x, set()).update(holders[y])
        return {x: np.array(sorted(tokens), dtype=np.int64) for x, tokens in found.items()}

    def conflicts_by_spine(self, a: int) -> np.ndarray:
        """bool `(size,)`: the tokens a merge would join to ``a``, read from the merges that
        meet ``a``'s right spine (what :attr:`ranges` writes down ahead for every token; kept
        as the reference the tests hold it to). Columns of tokens with a late node on their
        left spine are not final here (:meth:`bigram_allowed` reads them from the merges)."""
        conflict = np.zeros(self.size, dtype=bool)
        offsets, partner, rank = self.partners
        member_offsets, member, rho = self.members
        formed = self.formed
        for x, consumed_at in self.right_spine(a):
            start, end = offsets[x], offsets[x + 1]
            if start == end:
                continue
            ys, ranks = partner[start:end], rank[start:end]
            keep = (ranks < consumed_at) & (formed[ys] < consumed_at)
            ys, ranks = ys[keep], ranks[keep]
            if not ys.size:
                continue
            starts, ends = member_offsets[ys], member_offsets[ys + 1]
            lengths = ends - starts
            if not lengths.any():
                continue
            index = expand_runs(starts, lengths)  # the ranges [starts[i], ends[i])
            hit = rho[index] >= np.repeat(np.maximum(ranks, formed[x]), lengths)
            conflict[member[index[hit]]] = True
        return conflict

    @functools.cached_property
    def _late_left_spines(self) -> tuple[np.ndarray, np.ndarray]:
        """The tokens with a late node on their left spine, once per symbol on that spine:
        (token, symbol) as two arrays."""
        owners, symbols = [], []
        for token in np.flatnonzero(self.late[1]).tolist():
            node = token
            while node >= 0:
                owners.append(token)
                symbols.append(node)
                node = int(self.left[node])
        return np.array(owners, dtype=np.int64), np.array(symbols, dtype=np.int64)

    def _meeting(self, a: int) -> np.ndarray:
        """The tokens with a symbol on their left spine that some merge joins to a symbol on
        ``a``'s right spine (whatever the ranks): the only ones a merge across the junction
        can reach."""
        offsets, partner, _ = self.partners
        member_offsets, member, _ = self.members
        found = [
            member[member_offsets[y] : member_offsets[y + 1]]
            for x, _ in self.right_spine(a)
            for y in distinct(partner[offsets[x] : offsets[x + 1]])
        ]
        return distinct(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)

    @functools.cached_property
    def formed(self) -> np.ndarray:
        """int64 `(V,)`: the rank of the merge that makes each token (-1: a byte, never made)."""
        return np.where(self.made_at == _INF, -1, self.made_at)

    @functools.cached_property
    def strings(self) -> dict[int, str]:
        """Each id's string in the model's vocabulary (as the model writes it)."""
        return {token: string for string, token in self.vocab.items()}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its ids, ranks and offsets int32 where they fit (tables kept on disk),
        without what it derives on first use (``formed``, ``strings``)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("formed", "strings")}
        return narrowed_state(state, ("left", "right", "made_at", "partners", "members"))

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(widened_state(state))

    def caches(self) -> tuple[Any, ...]:
        """What the tree fills as it is used: the merges-only model, late tokens' answers, the
        pairs read from the merges."""
        return self._merges_only, self._late_rows, self._late_pairs

    @property
    def merges_model(self) -> Any:
        """The tokenizer's BPE model without ``ignore_merges`` (the merges alone), built once."""
        if not self._merges_only:
            from tokenizers import models

            merges = [
                tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in self.merges
            ]
            self._merges_only.append(
                models.BPE(
                    self.vocab, merges, ignore_merges=False, byte_fallback=self.byte_fallback
                )
            )
        return self._merges_only[0]

    def _bigram_by_merges(self, a: int, others: np.ndarray) -> np.ndarray:
        """bool `(len(others),)`: whether the merges alone give ``[a, b]`` for the bytes of
        ``a`` then ``b``, read from the model itself (for the few tokens the rule cannot say;
        each pair kept: Llama 3's rows meet about nine such tokens a last token, and half of
        the pairs along real text repeat)."""
        return _merged_pairs(self.merges_model, self.strings, a, others, self._late_pairs)

    def right_spine(self, a: int) -> list[tuple[int, int]]:
        """(symbol, rank of the merge that consumes it) down the right edge of ``a``'s tree."""
        spine = [(a, _INF)]
        node = a
        while self.right[node] >= 0:
            spine.append((int(self.right[node]), int(self.made_at[node])))
            node = int(self.right[node])
        return spine


def _merge_tree(
    merges: list[Any], vocab: dict[str, int], size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each merged token's children and the rank that makes it, and the merges by left symbol.

    A token that several merges make (Llama 3's vocabulary, converted from tiktoken's ranks,
    holds a merge for every split of a token into two tokens) has one tree all the same: the one
    BPE builds from the token's own bytes. Where the token ends up whole, no merge ever crossed
    its edges, and the merges inside it ran as they run on its bytes alone (lowest rank first,
    leftmost among equals). Its children are the two parts that tree joins last; a token that
    its own bytes never make (only ``ignore_merges`` gives it, as a whole chunk) has none.
    """
    left = np.full(size, -1, dtype=np.int64)
    right = np.full(size, -1, dtype=np.int64)
    made_at = np.full(size, _INF, dtype=np.int64)
    rows = []
    pairs: dict[tuple[int, int], tuple[int, int]] = {}  # (x, y) -> (rank, token), as BPE reads
    several: set[int] = set()
    for rank, merge in enumerate(merges):
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        x, y, z = vocab.get(a), vocab.get(b), vocab.get(a + b)
        if x is None or y is None or z is None or z >= size:
            continue
        pairs.setdefault((x, y), (rank, z))
        if made_at[z] != _INF:
            several.add(z)
        else:
            left[z], right[z], made_at[z] = x, y, rank
        rows.append((x, y, rank))
    if several:
        strings = {token: string for string, token in vocab.items() if token < size}
        for z in several:
            last = _last_merge([vocab.get(char, -1) for char in strings[z]], pairs)
            if last is not None and last[3] == z:
                left[z], right[z], made_at[z] = last[:3]
            else:  # never made by merges: a leaf (it cannot stand inside a merged chunk)
                left[z], right[z], made_at[z] = -1, -1, _INF
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    order = np.argsort(table[:, 0], kind="stable")
    table = table[order]
    offsets = np.searchsorted(table[:, 0], np.arange(size + 1))
    return left, right, made_at, (offsets, table[:, 1].copy(), table[:, 2].copy())


def _late_spines(
    left: np.ndarray, right: np.ndarray, made_at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """bool `(V,)` twice: tokens with a *late* node on their right spine, and on their left
    spine (themselves included). A node is late when a node under it is made by a merge of a
    later rank than its own: BPE then makes it after its own rank (Llama 3's converted merges
    have a few; a vocabulary trained by BPE has none)."""
    merged = left >= 0
    formed = np.where(made_at == _INF, -1, made_at)
    latest = formed.copy()  # the latest rank in each token's tree
    while True:
        grown = latest.copy()
        grown[merged] = np.maximum(
            formed[merged], np.maximum(latest[left[merged]], latest[right[merged]])
        )
        if np.array_equal(grown, latest):
            break
        latest = grown
    late = merged & (latest > formed)
    spines = []
    for child in (right, left):
        on = late.copy()
        while True:
            grown = on.copy()
            grown[merged] |= on[child[merged]]
            if np.array_equal(grown, on):
                break
            on = grown
        spines.append(on)
    return spines[0], spines[1]


def _last_merge(
    symbols: list[int], pairs: dict[tuple[int, int], tuple[int, int]]
) -> tuple[int, int, int, int] | None:
    """BPE over ``symbols`` (lowest rank first, leftmost among equals): the last merge it
    applies, ``(x, y, rank, token)``, when it ends with one symbol; else None."""
    last = None
    while len(symbols) > 1:
        best: tuple[int, int, int] | None = None
        for index in range(len(symbols) - 1):
            found = pairs.get((symbols[index], symbols[index + 1]))
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], index, found[1])
        if best is None:
            return None
        rank, index, token = best
        last = (symbols[index], symbols[index + 1], rank, token)
        symbols[index : index + 2] = [token]
    return last


def _left_spines(
    left: np.ndarray, made_at: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each symbol y, the tokens whose left spine holds y, with the rank of the merge that
    consumes y there (_INF for the token itself)."""
    symbols, tokens, ranks = [], [], []
    for token in range(size):
        node, consumed_at = token, _INF
        while True:
            symbols.append(node)
            tokens.append(token)
            ranks.append(consumed_at)
            child = int(left[node])
            if child < 0:
                break
            node, consumed_at = child, int(made_at[node])
    table = np.array([symbols, tokens, ranks], dtype=np.int64)
    order = np.argsort(table[0], kind="stable")
    table = table[:, order]
    offsets = np.searchsorted(table[0], np.arange(size + 1))
    return offsets, table[1].copy(), table[2].copy()


def _merged_pairs(
    model: Any,
    strings: dict[int, str],
    a: int,
    others: np.ndarray,
    known: dict[tuple[int, int], bool] | None = None,
) -> np.ndarray:
    """bool `(len(others),)`: whether ``model`` (the merges alone) gives ``[a, b]`` for the
    strings of ``a`` then ``b``; each answer kept in ``known`` (cleared when full) if given."""
    head = strings.get(a)
    result = np.zeros(len(others), dtype=bool)
    if head is None:
        return result
    for index, b in enumerate(others.tolist()):
        answer = known.get((a, b)) if known is not None else None
        if answer is None:
            tail = strings.get(b)
            answer = tail is not None and [t.id for t in model.tokenize(head + tail)] == [a, b]
            if known is not None:
                if len(known) >= _LATE_PAIRS:
                    known.clear()
                known[(a, b)] = answer
        result[index] = answer
    return result


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of integers, sorted, by one sort (numpy 2.4's ``np.unique`` hashes, and
    takes 10-15x as long on the few thousand ids a merge-tree test reads)."""
    ordered = np.sort(values)
    if ordered.size:
        ordered = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    return ordered


__all__ = ["MergeTree", "distinct"]
