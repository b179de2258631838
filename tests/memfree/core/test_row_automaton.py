"""The canonical step's automaton (memfree/core/row_automaton.py), a run state's row from its
parts (``CanonicalMasker._run_parts``), and the prefix index's bans set into canonical
decoding's mask (``IndexMasker.banned_into``): each against what it replaces."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core import row_automaton, rule_automaton
from memfree.core.canonical import CanonicalMasker
from memfree.core.text_promise import union
from memfree.vocab.bpe import LETTER, NUMBER, PUNCT
from memfree.vocab.info import TokenizerInfo
from tests.conftest import llama_cpp_tokenizer
from tests.memfree.core.test_canonical import _split

TEXTS = [
    "def f(x):\n\n    return x  + 1\n\n\nclass A:\n\tpass",
    "It's a test.\n\nThe end -- they'll see 12345 and 3.14!",
    "Hello\n\nWorld  \n \n  x\u00a0y 日本語 😀 café",
    "if x:\n    y = [1, 2]  # done\n\n\n\ndef g(): pass",
]


@pytest.fixture(scope="module", params=["smollm2", "gpt-2"])
def rules_masker(request: pytest.FixtureRequest, default_tokenizer: Any) -> CanonicalMasker:
    """GPT-2's pattern read by rules: SmolLM2's tokenizer, and GPT-2's real vocabulary."""
    tokenizer = default_tokenizer if request.param == "smollm2" else llama_cpp_tokenizer("gpt-2")
    info = TokenizerInfo.of(tokenizer)
    return CanonicalMasker(info, [info.eos_token_id])


def _row(masker: CanonicalMasker, key: tuple[Any, ...], width: int, fast: bool) -> np.ndarray:
    row = np.empty(width, dtype=bool)
    masker.fast_runs = fast
    try:
        masker._fill(row, key, width)
    finally:
        masker.fast_runs = True
    return row


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_run_states_row_from_its_parts_is_the_rules_row(
    rules_masker: CanonicalMasker, data: st.DataObject
) -> None:
    """After a run of letters, digits or punctuation the banned row is put together from the
    class's two precomputed rows and the tokens the merge-tree test fails after the run's last
    token; it equals the rules' general path for every token (reached or not), with the pseudo
    candidates of characters written with several tokens, at the tokenizer's width and past it."""
    masker = rules_masker
    size = masker.bpe.vocab_size
    a = data.draw(st.integers(0, size - 1), label="a")
    cls = data.draw(st.sampled_from([LETTER, NUMBER, PUNCT]), label="cls")
    width = size + data.draw(st.sampled_from([0, 5]), label="past")
    key = ("run", cls, a, ())
    assert np.array_equal(_row(masker, key, width, True), _row(masker, key, width, False))


def test_the_merge_tree_tests_failures_are_its_row(rules_masker: CanonicalMasker) -> None:
    """``joined(a)``: where ``bigram_allowed(a)`` is False, without the row."""
    size = rules_masker.bpe.vocab_size
    for a in np.random.default_rng(0).choice(size, 200, replace=False).tolist():
        joined = rules_masker.bpe.joined(a)
        assert np.array_equal(np.sort(joined), np.flatnonzero(~rules_masker.bpe.bigram_allowed(a)))


def _walk(masker: CanonicalMasker, tokenizer: Any, steps: int) -> list[np.ndarray]:
    """Each step's banned rows over rows that grow by their text's next token (two texts
    reversed, so that rows are replaced and read afresh too)."""
    sources = [_split(tokenizer, t, 0, 0) for t in TEXTS]
    rows = [source[:3] for source in sources]
    found = []
    for step in range(steps):
        if step == steps // 2:
            rows[0] = _split(tokenizer, TEXTS[0][::-1], 0, 0)[:4]
            sources[0] = _split(tokenizer, TEXTS[0][::-1], 0, 0)
        length = max(map(len, rows))
        batch = torch.tensor([[-1] * (length - len(r)) + r for r in rows])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            banned, _, _ = masker.step(batch, masker.bpe.vocab_size)
        found.append(banned.numpy().copy())
        for row, source in zip(rows, sources, strict=True):
            row.append(source[len(row)] if len(source) > len(row) else source[0])
    return found


@pytest.mark.parametrize("split", [False, True], ids=["rules-arrays", "split-reads"])
def test_an_automaton_that_starts_afresh_answers_the_same(
    default_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, split: bool
) -> None:
    """Past its bound the automaton forgets every state id at a step's start (the rows are read
    again, the table's rows found again by key): every step's rows are the same as with no
    bound, and it did start afresh. Both automata: GPT-2's rules' (rows as arrays) and the
    split patterns' (GPT-2's pattern read as one)."""
    info = TokenizerInfo.of(default_tokenizer)
    kept = _walk(CanonicalMasker(info, [info.eos_token_id], _split=split), default_tokenizer, 20)
    monkeypatch.setattr(row_automaton, "_LIMIT", 3)
    monkeypatch.setattr(rule_automaton, "_LIMIT", 3)
    masker = CanonicalMasker(info, [info.eos_token_id], _split=split)
    masker.table.capacity = 4
    afresh = _walk(masker, default_tokenizer, 20)
    assert masker.automaton.generation > 10
    for step, (one, other) in enumerate(zip(kept, afresh, strict=True)):
        assert np.array_equal(one, other), step


def test_a_transition_kept_is_taken_again(default_tokenizer: Any) -> None:
    """Two rows that repeat a read and a token share the transition: the second is not
    advanced again (the states' advance is called once per new transition). The split
    patterns' automaton (GPT-2's pattern read as one)."""
    info = TokenizerInfo.of(default_tokenizer)
    masker = CanonicalMasker(info, [info.eos_token_id], _split=True)
    ids = _split(default_tokenizer, "    return x\n    return y\n", 0, 0)
    calls = []
    advance = masker.states.advance
    masker.states.advance = lambda *args: calls.append(args) or advance(*args)  # type: ignore[method-assign]
    masker.automaton = masker._automaton()
    batch = torch.tensor([ids[:2], ids[:2]])
    masker.step(batch, masker.bpe.vocab_size)
    masker.step(torch.tensor([ids[:3], ids[:3]]), masker.bpe.vocab_size)
    assert len(calls) == 1
    ids_now = masker.automaton.step(
        np.array([ids[:3], ids[:3]], dtype=np.int64), [0, 0], [False, False]
    )
    assert ids_now[0] == ids_now[1]


def test_the_prefix_index_sets_its_bans_into_canonical_decodings_mask(
    default_tokenizer: Any, tmp_path: Path
) -> None:
    """On the CPU the token guard with canonical decoding asks the prefix index to set its bans
    in canonical decoding's own mask: the same as the union of the two masks, special tokens
    (which the filter never bans) left as canonical decoding has them."""
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree import MemFreeLogitsProcessor, NgramFilter

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS * 3))
    out = tmp_path / "f.memfree"
    settings = BuildSettings(ngram_size=4, min_count=1)
    build_filter([str(corpus)], out, settings, tokenizer=default_tokenizer, progress=False)
    guard = MemFreeLogitsProcessor(NgramFilter.open(out), tokenizer=default_tokenizer)
    masker = guard.masker
    ids = [_split(default_tokenizer, t, 0, 0) for t in TEXTS]
    width = masker.canonical.bpe.vocab_size
    some = 0
    for length in range(4, 16):
        batch = torch.tensor([row[:length] for row in ids])
        banned, active = masker.banned_mask(batch, width)
        token, token_active, noncanonical, readings = masker.parts(batch, width)
        some += int((token & ~noncanonical).sum())
        expected = union(noncanonical, token)
        for row, candidate, _ in readings:
            expected[row, candidate] = True
        assert torch.equal(banned, expected), length
        assert torch.equal(active, token_active), length
    assert some  # the filter's bans were not all canonical decoding's already
