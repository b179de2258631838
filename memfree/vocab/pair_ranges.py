"""The merge-tree test of every token at once, as ranges: which tokens may not follow which.

:meth:`~memfree.vocab.merge_tree.MergeTree.bigram_allowed` reads, for one token ``a``, the
tokens ``b`` that a merge would join to it: some ``x`` on ``a``'s right spine and ``y`` on
``b``'s left spine form a merge of rank ``r`` with ``r < cons(x)``, ``form(y) < cons(x)`` and
``cons_b(y) >= max(r, form(x))`` (the proof is in docs/canonical.md). Done per token with numpy
over the merges that meet its spine, that costs about 0.1 ms: a canonical masker pays it for
every token that ends a row for the first time.

The conflicts fall into few runs once the tokens are put in a good order (the research behind
issue 35 measured a mean of 19 on SmolLM2). Order the tokens by a depth-first walk of the
*left-spine forest* (a token's parent is its left child; bytes and tokens no merge makes are
roots), a node before its children and the children by the rank that makes them, latest first.
Then the tokens whose left spine holds ``y`` are ``y``'s subtree, one run from ``y`` on; and
those where the merge that consumes ``y`` has rank at least ``t`` are ``y`` and the subtrees of
its children made at ``t`` or later: a prefix of that run. So each merge ``(x, y)`` that meets
``a``'s right spine bans one run, and :func:`pair_ranges` builds all of them, for every token
at once (vectorized over the merges), and keeps each token's runs merged (CSR).

The runs are the same conflicts the per-token reading finds, term for term (the same three
conditions over the same merges), only written down ahead; tokens with a *late* node on their
right spine are read from the merges as before (:class:`~memfree.vocab.merge_tree.MergeTree`);
the columns of tokens with one on their left (Llama 3's converted merges) are read from the
merges once, at build, for every token (:class:`LatePairs`), and taken out of the runs'
answer. Tested equal to the per-token reading over every token of trained vocabularies and
samples of the real ones (``tests/memfree/vocab/test_pair_ranges.py``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

_CHUNK = 1 << 20  # (token, merge) pairs expanded at once while building (about 64 MiB of arrays)


@dataclass(frozen=True, eq=False)
class PairRanges:
    """Each token's conflicts (the tokens a merge would join to it) as runs of positions in
    one order of the vocabulary.

    Attributes:
        order: int32 `(V,)`: the token at each position.
        position: int32 `(V,)`: each token's position.
        offsets: int64 `(V + 1,)`: token ``a``'s runs are ``starts[offsets[a]:offsets[a+1]]``
            and the same slice of ``ends`` (disjoint, increasing, half-open).
        starts, ends: int32: the runs.
        skipped: bool `(V,)`: tokens left out (a late node on their right spine: the caller
            reads them from the merges).
    """

    order: np.ndarray
    position: np.ndarray
    offsets: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    skipped: np.ndarray

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k != "_keys"}
        return narrowed_state(state, ("offsets",))

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(widened_state(state))

    @property
    def nbytes(self) -> int:
        arrays = (self.order, self.position, self.offsets, self.starts, self.ends)
        return sum(int(array.nbytes) for array in arrays)

    def conflicts(self, a: int) -> np.ndarray:
        """int32: the tokens a merge would join to ``a`` (unordered, no repeats)."""
        lo, hi = int(self.offsets[a]), int(self.offsets[a + 1])
        if lo == hi:
            return np.zeros(0, dtype=np.int64)
        if hi - lo <= _FEW_RUNS:  # a few runs: slices joined (half the cost of one index array)
            order = self.order
            spans = zip(self.starts[lo:hi].tolist(), self.ends[lo:hi].tolist(), strict=True)
            return np.concatenate([order[start:end] for start, end in spans])
        starts = self.starts[lo:hi].astype(np.int64)
        lengths = self.ends[lo:hi].astype(np.int64) - starts
        return self.order[expand_runs(starts, lengths)]

    def joins(self, a: int, b: int) -> bool:
        """Whether a merge would join ``b`` to ``a`` (``b`` among :meth:`conflicts`), by a
        binary search over ``a``'s runs."""
        lo, hi = int(self.offsets[a]), int(self.offsets[a + 1])
        if lo == hi:
            return False
        at = int(self.position[b])
        # bisect over the array itself: a third of np.searchsorted's cost on a few runs
        run = bisect.bisect_right(self.starts, at, lo, hi) - 1
        return run >= lo and at < int(self.ends[run])

    def joins_many(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """bool: :meth:`joins` for each pair ``(a[i], b[i])`` at once (int64 arrays), by one
        binary search over every token's runs, keyed by token then start."""
        keys = self.__dict__.get("_keys")
        if keys is None:  # kept on the object (frozen: written to its dict), not pickled
            owners = np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))
            keys = self.__dict__["_keys"] = owners * (len(self.position) + 1) + self.starts
        at = self.position[b].astype(np.int64)
        run = np.searchsorted(keys, a * (len(self.position) + 1) + at, side="right") - 1
        inside = run >= self.offsets[a]  # the run found is one of a's (else a has none there)
        return inside & (at < self.ends[np.maximum(run, 0)])

    def conflicts_without(self, a: int, tokens: np.ndarray) -> np.ndarray:
        """int32: :meth:`conflicts` of ``a`` but ``tokens`` (a few), taken out by position."""
        lo, hi = int(self.offsets[a]), int(self.offsets[a + 1])
        if lo == hi:
            return np.zeros(0, dtype=np.int32)
        starts = self.starts[lo:hi].astype(np.int64)
        at = expand_runs(starts, self.ends[lo:hi].astype(np.int64) - starts)  # increasing
        drop = np.sort(self.position[tokens]).astype(np.int64)
        where = np.searchsorted(at, drop)
        inside = where < at.size
        where = where[inside]
        hit = at[where] == drop[inside]
        if hit.any():
            at = np.delete(at, where[hit])
        return self.order[at]


@dataclass(frozen=True, eq=False)
class LatePairs:
    """The columns the runs do not say, written down ahead: for each token ``a``, the tokens
    with a late node on their left spine that some merge joins to a symbol on ``a``'s right
    spine (Llama 3's converted merges: about 800,000 pairs over 103 such tokens), and whether
    the merges join each to ``a``, read once from the merges themselves
    (:meth:`~memfree.vocab.merge_tree.MergeTree.of`). Empty for a token with a late node on
    its right spine (read from the merges whole).

    Attributes:
        offsets: int64 `(V + 1,)`: token ``a``'s pairs are ``tokens[offsets[a]:offsets[a+1]]``.
        tokens: int32: the late tokens, increasing for each ``a``.
        joins: bool: a merge joins that token to ``a`` (``[a, b]`` is not BPE's).
    """

    offsets: np.ndarray
    tokens: np.ndarray
    joins: np.ndarray

    def __getstate__(self) -> dict[str, Any]:
        return narrowed_state(dict(self.__dict__), ("offsets",))

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(widened_state(state))

    @property
    def nbytes(self) -> int:
        return int(self.offsets.nbytes + self.tokens.nbytes + self.joins.nbytes)

    def of(self, a: int) -> tuple[np.ndarray, np.ndarray]:
        """``a``'s late tokens (int64) and whether a merge joins each to it."""
        lo, hi = int(self.offsets[a]), int(self.offsets[a + 1])
        return self.tokens[lo:hi].astype(np.int64), self.joins[lo:hi]


_FEW_RUNS = 32  # runs of a token read as slices (more: one index array, expand_runs)


def narrowed_state(state: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """A pickle's state with the int64 arrays of ``names`` (arrays, or tuples of them) whose
    values fit in int32 written as int32, and named in ``"_narrowed"``: ids, ranks and offsets of
    a vocabulary below 2**31 take half the bytes on disk. :func:`widened_state` undoes it."""
    state = dict(state)
    narrowed = []
    for name in names:
        value = state.get(name)
        arrays = value if isinstance(value, tuple) else (value,)
        if all(_fits_int32(array) for array in arrays):
            small = tuple(array.astype(np.int32) for array in arrays)
            state[name] = small if isinstance(value, tuple) else small[0]
            narrowed.append(name)
    state["_narrowed"] = tuple(narrowed)
    return state


def widened_state(state: dict[str, Any]) -> dict[str, Any]:
    """The state :func:`narrowed_state` wrote, with its arrays int64 again."""
    state = dict(state)
    for name in state.pop("_narrowed", ()):
        value = state[name]
        if isinstance(value, tuple):
            state[name] = tuple(array.astype(np.int64) for array in value)
        else:
            state[name] = value.astype(np.int64)
    return state


def _fits_int32(array: Any) -> bool:
    if not isinstance(array, np.ndarray) or array.dtype != np.int64:
        return False
    info = np.iinfo(np.int32)
    return array.size == 0 or (int(array.min()) >= info.min and int(array.max()) <= info.max)


def pair_ranges(
    left: np.ndarray,
    right: np.ndarray,
    made_at: np.ndarray,
    partners: tuple[np.ndarray, np.ndarray, np.ndarray],
    skip: np.ndarray,
) -> PairRanges:
    """Every token's conflicts as runs (see the module's docstring).

    Args:
        left, right, made_at: the merge trees (:class:`~memfree.vocab.merge_tree.MergeTree`;
            ``made_at`` is a huge number for a token no merge makes).
        partners: the merges by left symbol, CSR (offsets, right symbol, rank), each symbol's
            merges in increasing rank.
        skip: tokens not to read (a late node on their right spine).
    """
    size = len(left)
    merged = left >= 0
    formed = np.where(merged, made_at, -1)
    span = int(formed.max(initial=0)) + 2  # every rank and every threshold is below it
    order, position, cum, kid_keys, kid_offsets = _forest(left, made_at, size, span)

    offsets, partner, rank = partners
    # Each token's right spine: (owner, symbol, rank of the merge that consumes the symbol).
    owners = np.flatnonzero(~skip)
    symbols = owners.copy()
    consumed = np.full(len(owners), span, dtype=np.int64)  # not consumed: any rank meets it
    spine_owner, spine_symbol, spine_consumed = [owners], [symbols], [consumed]
    while True:
        going = right[symbols] >= 0
        owners, parents = owners[going], symbols[going]
        if not owners.size:
            break
        symbols, consumed = right[parents], np.minimum(made_at[parents], span)
        spine_owner.append(owners)
        spine_symbol.append(symbols)
        spine_consumed.append(consumed)
    owner = np.concatenate(spine_owner)
    symbol = np.concatenate(spine_symbol)
    cons = np.concatenate(spine_consumed)
    # The merges (x, y) of rank below cons(x): a prefix of x's merges (they are by rank).
    partner_keys = np.repeat(np.arange(size, dtype=np.int64), np.diff(offsets)) * span + rank
    firsts = offsets[symbol]
    counts_below = np.searchsorted(partner_keys, symbol * span + cons) - firsts
    keep = counts_below > 0
    owner, symbol, cons, firsts, counts_below = (
        owner[keep], symbol[keep], cons[keep], firsts[keep], counts_below[keep]
    )  # fmt: skip

    found_owner, found_start, found_end = [], [], []
    before = np.concatenate([[0], np.cumsum(counts_below)])
    lo = 0
    while lo < len(owner):  # (spine symbol, merge) pairs expanded about _CHUNK at a time
        hi = max(int(np.searchsorted(before, before[lo] + _CHUNK, side="right")) - 1, lo + 1)
        part = slice(lo, hi)
        lengths = counts_below[part]
        index = expand_runs(firsts[part], lengths)
        y = partner[index]
        r = rank[index]
        o = np.repeat(owner[part], lengths)
        c = np.repeat(cons[part], lengths)
        x = np.repeat(symbol[part], lengths)
        meets = formed[y] < c
        y, r, o, x = y[meets], r[meets], o[meets], x[meets]
        threshold = np.maximum(r, formed[x])
        # y and the subtrees of its children made at the threshold or later: a prefix of y's run.
        past = np.searchsorted(kid_keys, y * span + (span - 1 - threshold), side="right")
        covered = cum[past] - cum[kid_offsets[y]]
        start = position[y]
        found_owner.append(o)
        found_start.append(start)
        found_end.append(start + 1 + covered)
        lo = hi
    return _merged(size, order, found_owner, found_start, found_end, skip)


def _forest(
    left: np.ndarray, made_at: np.ndarray, size: int, span: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The depth-first order of the left-spine forest: (order, each token's position, the
    children's cumulative subtree sizes, the children's search keys, each node's first child
    in that list)."""
    merged = left >= 0
    parent = np.where(merged, left, -1)
    depth = np.zeros(size, dtype=np.int64)
    while True:  # depth along the left spine (a left child is made before its parent)
        grown = np.where(merged, depth[np.maximum(parent, 0)] + 1, 0)
        if np.array_equal(grown, depth):
            break
        depth = grown
    sizes = np.ones(size, dtype=np.int64)
    for level in range(int(depth.max(initial=0)), 0, -1):
        nodes = np.flatnonzero(depth == level)
        np.add.at(sizes, parent[nodes], sizes[nodes])
    # Children by parent, latest made first; their keys for the prefix search.
    kids = np.flatnonzero(merged)
    kids = kids[np.lexsort((kids, -made_at[kids], parent[kids]))]
    kid_keys = parent[kids] * span + (span - 1 - made_at[kids])
    kid_offsets = np.searchsorted(parent[kids], np.arange(size + 1))
    cum = np.concatenate([[0], np.cumsum(sizes[kids])])
    # Positions: roots one after another; a child after its parent and its earlier siblings.
    position = np.zeros(size, dtype=np.int64)
    roots = np.flatnonzero(~merged)
    position[roots] = np.concatenate([[0], np.cumsum(sizes[roots])[:-1]]) if roots.size else []
    sibling_before = cum[:-1] - cum[kid_offsets[parent[kids]]]
    for level in range(1, int(depth.max(initial=0)) + 1):
        at = depth[kids] == level
        nodes = kids[at]
        position[nodes] = position[parent[nodes]] + 1 + sibling_before[at]
    order = np.empty(size, dtype=np.int64)
    order[position] = np.arange(size)
    return order, position, cum, kid_keys, kid_offsets


def _merged(
    size: int,
    order: np.ndarray,
    owners: list[np.ndarray],
    starts: list[np.ndarray],
    ends: list[np.ndarray],
    skip: np.ndarray,
) -> PairRanges:
    """Each owner's runs, overlapping and touching ones merged, as CSR."""
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    start = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    end = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
    sort = np.lexsort((start, owner))
    owner, start, end = owner[sort], start[sort], end[sort]
    if owner.size:
        # The furthest end so far within each owner: a run that starts past it opens a new one.
        group = np.r_[True, owner[1:] != owner[:-1]]
        reach = _segment_max(end, group)
        opens = group.copy()
        opens[1:] |= start[1:] > reach[:-1]
        firsts = np.flatnonzero(opens)
        closes = np.r_[firsts[1:] - 1, len(owner) - 1]
        owner, start, end = owner[firsts], start[firsts], reach[closes]
    offsets = np.searchsorted(owner, np.arange(size + 1))
    position = np.empty(size, dtype=np.int32)
    position[order] = np.arange(size, dtype=np.int32)
    return PairRanges(
        order.astype(np.int32), position, offsets, start.astype(np.int32), end.astype(np.int32),
        skip.copy(),
    )  # fmt: skip


def _segment_max(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """The running maximum of ``values``, restarted where ``group`` is True."""
    ids = np.cumsum(group) - 1
    # Offset each group above every earlier one so one running maximum serves them all.
    shift = (values.max(initial=0) + 1) * ids
    return np.maximum.accumulate(values + shift) - shift


def expand_runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The runs ``[starts[i], starts[i] + lengths[i])`` one after another, as one index array."""
    total = int(lengths.sum())
    shifts = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    return np.arange(total, dtype=np.int64) + shifts


__all__ = [
    "LatePairs",
    "PairRanges",
    "expand_runs",
    "narrowed_state",
    "pair_ranges",
    "widened_state",
]
