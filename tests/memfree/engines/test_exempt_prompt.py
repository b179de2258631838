"""Quoting the prompt (``exempt_prompt``), exact against a reference set: every stored n-gram the
guard allows occurs in the row's own prompt, every other stored n-gram is banned; canonical
decoding's own bans stay; and a memorizing model quotes its prompt with the exemption, not without,
yet never continues a stored passage past what the prompt holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.exempt import PromptNgrams
from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.filterfile.index.reader import IndexFilter
from memfree.testing import word_filter_from_texts
from memfree.vocab.words import new_word_ngrams, word_ngrams
from tests.conftest import MEMORIZED_DOCUMENTS, WORD_TEXTS

N = 4
SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@pytest.fixture(scope="module")
def stored(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """An index (1e-9: no chance ban in these tests) of the memorized documents' 4-grams, and
    the exact set."""
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in MEMORIZED_DOCUMENTS]
    exact = {tuple(row[i : i + N]) for row in rows for i in range(len(row) - N + 1)}
    path = tmp_path_factory.mktemp("exempt") / "f.memfree"
    filt = IndexFilter.from_ngrams(
        path,
        np.array(sorted(exact)),
        vocab_size=len(tokenizer),
        false_positive_rate=1e-9,
        metadata={"tokenizer_fingerprint": _fingerprint(tokenizer)},
    )
    return filt, exact, rows


def _fingerprint(tokenizer: Any) -> str:
    from memfree.vocab.info import TokenizerInfo

    return TokenizerInfo.of(tokenizer).fingerprint


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_token_unit_bans_exactly_what_the_prompt_does_not_hold(
    data: Any, tokenizer: Any, stored: Any
) -> None:
    filt, exact, rows = stored
    canonical = data.draw(st.booleans())
    guard = MemFreeLogitsProcessor(filt, tokenizer, canonical=canonical, exempt_prompt=True)
    plain = MemFreeLogitsProcessor(filt, tokenizer, canonical=canonical)
    source = rows[data.draw(st.integers(0, len(rows) - 1))]
    start = data.draw(st.integers(0, len(source) - 2))
    prompt = source[start : start + data.draw(st.integers(1, 30))]
    prompt = prompt + data.draw(st.lists(st.integers(0, len(tokenizer) - 1), max_size=3))
    # Then a few generated tokens: copied from a stored row, or anything.
    other = rows[data.draw(st.integers(0, len(rows) - 1))]
    at = data.draw(st.integers(0, len(other) - 1))
    generated = other[at : at + data.draw(st.integers(0, 6))]
    context = torch.tensor([prompt + generated])
    first = torch.tensor([prompt])
    guard(first, torch.zeros(1, len(tokenizer)))  # the generation's first step: the prompt
    mask, _ = guard.blocked_mask(context, len(tokenizer), prompts=guard._prompt_ngrams(context))
    before, _ = plain.blocked_mask(context, len(tokenizer))
    windows = {tuple(prompt[i : i + N]) for i in range(len(prompt) - N + 1)}
    tail = tuple((prompt + generated)[-(N - 1) :])
    for token in range(len(tokenizer)):
        ngram = (*tail, token)
        if len(tail) == N - 1 and ngram in exact and ngram not in windows:
            assert mask[0, token], ngram  # stored and not in the prompt: banned
        if mask[0, token] != before[0, token]:  # lifted: stored, and in the prompt
            assert not mask[0, token] and ngram in windows and ngram in exact
    assert not (mask & ~before).any()  # the exemption only lifts bans


def test_word_unit_lifts_only_word_ngrams_of_the_prompt(tokenizer: Any, tmp_path: Path) -> None:
    filt = word_filter_from_texts(tmp_path / "w.memfree", WORD_TEXTS, 3, layout="prefix-index")
    exact = {g for text in WORD_TEXTS for g in word_ngrams(text, 3)}
    guard = MemFreeLogitsProcessor(filt, tokenizer, exempt_prompt=True)
    plain = MemFreeLogitsProcessor(filt, tokenizer)
    text = WORD_TEXTS[-1]  # "The Quick Brown Fox said: hello, WORLD."
    prompt_text = "Please fix the case: " + text + "\nFixed:"
    prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    quoted = prompt + tokenizer(" the quick brown", add_special_tokens=False)["input_ids"]
    guard(torch.tensor([prompt]), torch.zeros(1, len(tokenizer)))
    context = torch.tensor([quoted])
    mask, _ = guard.blocked_mask(context, len(tokenizer), prompts=guard._prompt_ngrams(context))
    before, _ = plain.blocked_mask(context, len(tokenizer))
    allowed = set(word_ngrams(prompt_text, 3))
    old = tokenizer.decode(quoted)
    lifted = torch.nonzero(before[0] & ~mask[0]).flatten().tolist()
    assert lifted, "the quote continues a stored word 3-gram that the prompt holds"
    for token in range(len(tokenizer)):
        created = [
            g for g in new_word_ngrams(old, tokenizer.decode([*quoted, token]), 3) if g in exact
        ]
        if created and any(g not in allowed for g in created):
            assert mask[0, token]  # a stored word n-gram the prompt does not hold: banned
        if token in lifted:
            assert created and all(g in allowed for g in created)
    assert not (mask & ~before).any()


def test_a_memorizing_model_quotes_its_prompt_only_when_exempt(
    tokenizer: Any, stored: Any, memorizing_llama: Any
) -> None:
    """RAG-style: the prompt holds a retrieved stored passage; asked to repeat it, the guarded
    model may quote it with exempt_prompt; without, it may not; beyond it, never."""
    filt, exact, rows = stored
    passage = rows[1][:14]  # "import os\nimport sys\n..." cut short
    prompt = passage + passage[:10]  # the retrieved passage, then the start of a second copy
    inputs = torch.tensor([prompt])
    runs = {}
    for exempt in (False, True):
        guard = MemFreeLogitsProcessor(filt, tokenizer, canonical=False, exempt_prompt=exempt)
        out = memorizing_llama.generate(
            input_ids=inputs,
            attention_mask=torch.ones_like(inputs),
            logits_processor=[guard],
            max_new_tokens=16,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        runs[exempt] = out[0, len(prompt) :].tolist()
    windows = {tuple(prompt[i : i + N]) for i in range(len(prompt) - N + 1)}
    for exempt, output in runs.items():
        row = prompt + output
        created = [tuple(row[i - N + 1 : i + 1]) for i in range(len(prompt), len(row))]
        for ngram in created:
            if ngram in exact:
                assert exempt and ngram in windows, (exempt, ngram)
    first = tuple((prompt + runs[True])[len(prompt) - N + 1 : len(prompt) + 1])
    assert first in exact and first in windows, "with the exemption it quotes the passage"
    assert runs[True] != runs[False]


def test_prompt_ngrams_skip_padding_and_special_ids() -> None:
    found = PromptNgrams.of_ids([-1, -1, 5, 6, 7, -1, 8, 9, 10], 3)
    assert found.next_ids == {(5, 6): frozenset({7}), (8, 9): frozenset({10})}
