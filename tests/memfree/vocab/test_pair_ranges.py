"""The merge-tree test written down ahead as runs (:mod:`memfree.vocab.pair_ranges`) against
the per-token reading of the merges it replaces (``MergeTree.conflicts_by_spine``): every token
of trained vocabularies (byte-level under GPT-2's and Llama 3's pipelines, SentencePiece-style
with byte fallback), and SmolLM2's 49,152 tokens by Hypothesis. Llama 3's converted merges, with
their late nodes, are checked in ``tests/memfree/core/test_canonical_llama3.py``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.vocab.bpe import ByteLevelBpe
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.merge_tree import MergeTree
from memfree.vocab.pair_ranges import pair_ranges
from memfree.vocab.sentencepiece import SentencePieceBpe
from tests.conftest import train_sentencepiece, train_split_bpe


def _tree(tokenizer: Any, sentencepiece: bool = False) -> MergeTree:
    info = TokenizerInfo.of(tokenizer)
    tables = SentencePieceBpe.of(info) if sentencepiece else ByteLevelBpe.of(info)
    return tables.tree


def _check_token(tree: MergeTree, a: int, others: np.ndarray) -> None:
    """The runs give ``a``'s conflicts exactly, and the binary search agrees with the row."""
    assert tree.ranges is not None
    expected = np.flatnonzero(tree.conflicts_by_spine(a))
    found = tree.ranges.conflicts(a)
    assert len(np.unique(found)) == len(found), a  # no token twice
    assert np.array_equal(np.sort(found), expected), a
    row = tree.bigram_allowed(a)
    slow = dataclasses.replace(tree, ranges=None).bigram_allowed(a)
    assert np.array_equal(row, slow), a
    for b in others.tolist():
        assert tree.pair_allowed(a, b) == bool(row[b]), (a, b)
    # The vectorized search over every token's runs: the same for these pairs (where both
    # spines are early: the late ones are read from the merges).
    early = others[~tree.late[1][others]] if not tree.late[0][a] else others[:0]
    many = tree.ranges.joins_many(np.full(early.size, a, dtype=np.int64), early)
    assert np.array_equal(many, ~row[early]), a


@pytest.mark.parametrize("family", ["gpt2", "llama3", "sentencepiece"])
def test_every_token_of_a_trained_vocabulary(tokenizer: Any, family: str) -> None:
    if family == "gpt2":
        tree = _tree(tokenizer)
    elif family == "llama3":
        tree = _tree(train_split_bpe("llama3", 600))
    else:
        tree = _tree(train_sentencepiece(), sentencepiece=True)
    assert tree.ranges is not None
    rng = np.random.default_rng(0)
    with_conflicts = 0
    for a in range(tree.size):
        _check_token(tree, a, rng.integers(0, tree.size, 16))
        with_conflicts += bool(tree.ranges.offsets[a + 1] > tree.ranges.offsets[a])
    assert with_conflicts > 20  # the check met real conflicts, not only empty rows


@pytest.fixture(scope="module")
def smol_tree(default_tokenizer: Any) -> MergeTree:
    return _tree(default_tokenizer)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_smollm2_tokens(smol_tree: MergeTree, data: st.DataObject) -> None:
    a = data.draw(st.integers(0, smol_tree.size - 1))
    seed = data.draw(st.integers(0, 2**32 - 1))
    row = smol_tree.bigram_allowed(a)
    banned = np.flatnonzero(~row)
    rng = np.random.default_rng(seed)
    # Both sides of the answer: tokens a merge joins to a, and tokens it does not.
    others = np.concatenate(
        [rng.choice(banned, min(8, banned.size)), rng.integers(0, smol_tree.size, 8)]
    ).astype(np.int64)
    _check_token(smol_tree, a, others)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_conflicts_without_a_few_tokens(smol_tree: MergeTree, data: st.DataObject) -> None:
    """A token's conflicts but a few tokens, taken out by position (what Llama 3's late
    columns replace): tokens among the conflicts, at a run's ends, and outside them."""
    ranges = smol_tree.ranges
    assert ranges is not None
    a = data.draw(st.integers(0, smol_tree.size - 1))
    found = ranges.conflicts(a)
    lo, hi = int(ranges.offsets[a]), int(ranges.offsets[a + 1])
    edges = ranges.order[np.concatenate([ranges.starts[lo:hi], ranges.ends[lo:hi] - 1])]
    pool = np.concatenate([found, edges, np.arange(smol_tree.size)]).astype(np.int64)
    picks = data.draw(st.lists(st.integers(0, len(pool) - 1), max_size=12))
    tokens = np.unique(pool[picks]) if picks else np.zeros(0, dtype=np.int64)
    left = ranges.conflicts_without(a, tokens)
    assert np.array_equal(np.sort(left), np.setdiff1d(found, tokens))


def test_the_runs_are_few(smol_tree: MergeTree) -> None:
    """What makes the table small: SmolLM2's conflicts (about 1,800 tokens per token) fall into
    about 17 runs each in the left-spine order; 7 MiB for the whole vocabulary."""
    ranges = smol_tree.ranges
    assert ranges is not None
    runs = np.diff(ranges.offsets)
    assert runs.mean() < 25
    assert ranges.nbytes < 16 * 2**20
    # The order is a permutation, and position is its inverse.
    assert np.array_equal(np.sort(ranges.order), np.arange(smol_tree.size))
    assert np.array_equal(ranges.order[ranges.position], np.arange(smol_tree.size))


def test_tokens_skipped_have_no_runs_and_the_others_keep_theirs(smol_tree: MergeTree) -> None:
    """A token marked as skipped (a late node on its right spine: the tree reads it from the
    merges) gets no runs; the others' runs do not depend on which are skipped."""
    tree = smol_tree
    assert tree.ranges is not None
    skip = np.zeros(tree.size, dtype=bool)
    skip[::2] = True
    ranges = pair_ranges(tree.left, tree.right, tree.made_at, tree.partners, skip)
    assert not np.diff(ranges.offsets)[skip].any()
    for a in range(1, tree.size, 98):  # odd: not skipped
        assert np.array_equal(np.sort(ranges.conflicts(a)), np.sort(tree.ranges.conflicts(a)))


def test_built_in_small_chunks_the_runs_are_the_same(
    smol_tree: MergeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build expands (token, merge) pairs a chunk at a time: chunks of a few thousand give
    the same runs as the default (the chunk boundaries cut no token's runs short)."""
    from memfree.vocab import pair_ranges as module

    tree = smol_tree
    assert tree.ranges is not None
    monkeypatch.setattr(module, "_CHUNK", 5_000)
    small = pair_ranges(tree.left, tree.right, tree.made_at, tree.partners, tree.late[0])
    assert np.array_equal(small.offsets, tree.ranges.offsets)
    assert np.array_equal(small.starts, tree.ranges.starts)
    assert np.array_equal(small.ends, tree.ranges.ends)
