"""The llama.cpp adapter over numpy arrays, as llama-cpp-python calls it: exact scores against the
core, nothing stored ever emitted in a greedy loop, the model's vocabulary checked at
construction, and failing closed (end of sequence only, the error raised afterwards)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.engines.llama_cpp import GuardStepError, MemFreeLlamaCppLogitsProcessor
from memfree.errors import FilterError, FilterMismatchError
from memfree.units import get_unit


class FakeLlama:
    """What the adapter reads of ``llama_cpp.Llama``: n_vocab, token_eos, the GGUF token texts."""

    def __init__(self, tokenizer: Any, eos: int, texts: list[str] | None = None) -> None:
        texts = texts or tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.model_path = None
        self._n_vocab = len(texts)
        self._eos = eos
        self._model = SimpleNamespace(token_get_text=lambda index: texts[index])

    def n_vocab(self) -> int:
        return self._n_vocab

    def token_eos(self) -> int:
        return self._eos


def _guard(guarded: Any) -> MemFreeLlamaCppLogitsProcessor:
    llama = FakeLlama(guarded.tokenizer, guarded.eos)
    return MemFreeLlamaCppLogitsProcessor(guarded.filter, llama, tokenizer=guarded.tokenizer)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_greedy_loop_matches_the_core_and_emits_nothing_stored(
    data: Any, guarded: Any, helpers: Any
) -> None:
    guard = _guard(guarded)
    vocab = len(guarded.tokenizer)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    source = guarded.corpus_ids[data.draw(st.integers(0, len(guarded.corpus_ids) - 1))]
    start = data.draw(st.integers(0, len(source) - 1))
    prompt = source[start : start + data.draw(st.integers(0, 6))]
    row = list(prompt)
    with guard:
        for _ in range(12):
            scores = guarded.adversarial_scores(row, rng)[:vocab].numpy()
            before = scores.copy()
            out = guard(np.asarray(row, dtype=np.intc), scores)
            assert np.array_equal(scores, before)  # a new array; the input is not touched
            expected = guarded.reference(row, torch.from_numpy(scores))
            assert np.array_equal(out, expected.numpy())
            token = int(out.argmax())
            assert not helpers.stored_emitted(guarded, row, token)
            if token == guarded.eos:
                break
            row.append(token)
    stored, _ = get_unit(guarded.unit).created_ngram_counts(
        guarded.filter, prompt, row[len(prompt) :], tokenizer=guarded.tokenizer
    )
    assert stored == 0


def test_a_failing_step_allows_only_end_of_sequence(token_guarded: Any) -> None:
    guard = _guard(token_guarded)
    vocab = len(token_guarded.tokenizer)
    scores = np.random.default_rng(0).normal(size=vocab).astype(np.float32)
    # Scores that are not the vocabulary's (a llama.cpp that passed a subset, say).
    out = guard(np.asarray([5, 6], dtype=np.intc), scores[:10])
    assert np.isneginf(out).all() and out.shape == (10,)

    # An error inside the core.
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    guard.rows.setup.masker.banned_mask = broken  # type: ignore[method-assign]
    out = guard(np.asarray([5, 6, 7], dtype=np.intc), scores)
    assert np.flatnonzero(np.isfinite(out)).tolist() == [token_guarded.eos]
    assert out[token_guarded.eos] == scores[token_guarded.eos]
    with pytest.raises(GuardStepError, match=r"2 guarded llama\.cpp step"):
        guard.check()
    guard.check()  # reported once
    with pytest.raises(GuardStepError, match="boom"), guard:
        guard(np.asarray([5, 6, 7], dtype=np.intc), scores)


def test_the_model_vocabulary_is_checked(token_guarded: Any, word_guarded: Any) -> None:
    tok = token_guarded.tokenizer
    texts = tok.convert_ids_to_tokens(list(range(len(tok))))
    swapped = list(texts)
    swapped[40], swapped[41] = swapped[41], swapped[40]
    for guarded in (token_guarded, word_guarded):
        with pytest.raises(FilterMismatchError, match="token 40 is"):
            MemFreeLlamaCppLogitsProcessor(
                guarded.filter, FakeLlama(tok, guarded.eos, swapped), tokenizer=tok
            )
        with pytest.raises(FilterMismatchError, match="tokens, its tokenizer"):
            MemFreeLlamaCppLogitsProcessor(
                guarded.filter, FakeLlama(tok, guarded.eos, texts[:-1]), tokenizer=tok
            )
    with pytest.raises(FilterError, match="end-of-sequence token 40 is not"):
        MemFreeLlamaCppLogitsProcessor(token_guarded.filter, FakeLlama(tok, 40), tokenizer=tok)
    with pytest.raises(FilterMismatchError, match="not a GGUF file"):
        MemFreeLlamaCppLogitsProcessor(token_guarded.filter, FakeLlama(tok, token_guarded.eos))
