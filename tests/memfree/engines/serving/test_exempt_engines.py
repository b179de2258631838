"""``exempt_prompt`` in the engines (vLLM V1 and Model Runner V2 replicas, llama.cpp over numpy):
each row's scores equal the transformers guard's with the same setting and the same prompt, and
every stored n-gram an output may take occurs in that request's own prompt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.engines.llama_cpp import MemFreeLlamaCppLogitsProcessor
from memfree.engines.policy import ServingConfigError
from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.engines.vllm import MemFreeLogitsProcessor as VllmProcessor
from tests.memfree.engines.serving.test_llama_cpp import FakeLlama
from tests.memfree.engines.serving.test_vllm_v2 import _req_states


def _reference(guarded: Any, prompt: list[int], row: list[int], scores: torch.Tensor) -> Any:
    guard = MemFreeLogitsProcessor(
        guarded.filter, tokenizer=guarded.tokenizer, record_stats=False, exempt_prompt=True
    )
    guard(torch.tensor([prompt]), torch.zeros(1, scores.shape[0]))  # the generation's first step
    return guard(torch.tensor([row]), scores[None].clone())[0]


def _case(data: Any, guarded: Any) -> tuple[list[int], list[int]]:
    """A prompt holding a stored passage, and an output that quotes it or goes on with it."""
    source = guarded.corpus_ids[data.draw(st.integers(0, len(guarded.corpus_ids) - 1))]
    start = data.draw(st.integers(0, len(source) - 1))
    prompt = source[start : start + data.draw(st.integers(2, 12))]
    quote = data.draw(st.integers(0, len(prompt)))
    output = prompt[:quote] if data.draw(st.booleans()) else source[start : start + quote]
    return prompt, output


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_vllm_both_runners_exempt_the_prompt_as_transformers_does(
    data: Any, guarded: Any, helpers: Any, tokenizer_dir: Path
) -> None:
    prompt, output = _case(data, guarded)
    row = prompt + output
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    logits = guarded.adversarial_scores(row, rng)[None]
    expected = _reference(guarded, prompt, row, logits[0])
    memfree = {"filter": str(guarded.filter.path), "exempt_prompt": True}
    v1 = VllmProcessor(helpers.vllm_config(tokenizer_dir, memfree), torch.device("cpu"), False)
    params = SimpleNamespace(extra_args=None)
    v1.update_state(
        SimpleNamespace(
            batch_size=1, removed=[], added=[(0, params, prompt, list(output))], moved=[]
        )
    )
    assert torch.equal(v1.apply(logits.clone())[0], expected)
    states = _req_states(guarded.width)
    v2 = VllmProcessor(helpers.vllm_config(tokenizer_dir, memfree), states)
    states.all_token_ids.gpu[1, : len(row)] = torch.tensor(row)
    states.prompt_len.np[1] = len(prompt)
    states.total_len.gpu[1] = len(row)
    assert v2.add_request(1, params)
    v2.apply_staged_writes()
    ctx = SimpleNamespace(
        expanded_idx_mapping=torch.tensor([1], dtype=torch.int32),
        idx_mapping=torch.tensor([1], dtype=torch.int32),
        idx_mapping_np=np.asarray([1], dtype=np.int32),
        expanded_local_pos=torch.tensor([0], dtype=torch.int32),
        input_ids=torch.tensor([row[-1]], dtype=torch.int32),
    )
    assert torch.equal(v2.apply(logits.clone(), ctx)[0], expected)


def _llama_cpp_guard(guarded: Any) -> Any:
    llama = FakeLlama(guarded.tokenizer, guarded.eos)
    return MemFreeLlamaCppLogitsProcessor(
        guarded.filter, llama, tokenizer=guarded.tokenizer, exempt_prompt=True
    )


def _generation(
    guard: Any, guarded: Any, prompt: list[int], output: list[int], rng: Any
) -> Iterator[tuple[int, bool]]:
    """One generation in llama.cpp (inside ``with guard:``): each step's row end, and whether
    the adapter's scores equal transformers' with the same prompt."""
    vocab = len(guarded.tokenizer)
    with guard:
        for end in range(len(prompt), len(prompt) + len(output) + 1):
            row = (prompt + output)[:end]
            scores = guarded.adversarial_scores(row, rng)[:vocab]
            out = guard(np.asarray(row, dtype=np.intc), scores.numpy().copy())
            expected = _reference(guarded, prompt, row, scores)
            yield end, np.array_equal(out, expected.numpy())


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_llama_cpp_exempts_the_prompt_of_each_generation(data: Any, guarded: Any) -> None:
    guard = _llama_cpp_guard(guarded)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for _ in range(2):  # a new prompt is read at each generation's first step
        prompt, output = _case(data, guarded)
        for end, same in _generation(guard, guarded, prompt, output, rng):
            assert same, end


def test_llama_cpp_reads_a_new_prompt_that_extends_the_last_generations_row(
    guarded: Any,
) -> None:
    """Found by the test above: a generation whose prompt is the last generation's row one
    token longer looks, by its ids alone, like the next step of that generation, so its prompt
    was the old one. ``with guard:`` starts a generation: its first row is its prompt."""
    guard = _llama_cpp_guard(guarded)
    rng = np.random.default_rng(0)
    checked = 0
    for source in guarded.corpus_ids[:4]:
        for start in range(min(len(source) - 4, 6)):
            passage = source[start:]
            for prompt, output in ((passage[:2], []), (passage[:3], passage[:2])):
                for end, same in _generation(guard, guarded, prompt, output, rng):
                    assert same, (source, start, end)
                    checked += 1
    assert checked > 40


def test_the_operator_setting_is_checked(helpers: Any, tokenizer_dir: Path, guarded: Any) -> None:
    memfree = {"filter": str(guarded.filter.path), "exempt_prompt": "yes"}
    with pytest.raises(ServingConfigError, match=r"\['exempt_prompt'\] must be true, false or"):
        VllmProcessor(helpers.vllm_config(tokenizer_dir, memfree), torch.device("cpu"), False)


def test_a_quote_is_lifted_and_a_continuation_is_not(
    token_guarded: Any, helpers: Any, tokenizer_dir: Path
) -> None:
    """Deterministic: quoting the prompt's own passage is allowed, the passage's stored
    continuation (not in the prompt) is not."""
    guarded = token_guarded  # the word unit's case: tests/memfree/engines/test_exempt_prompt.py
    source = max(guarded.corpus_ids, key=len)
    prompt = source[:8]
    memfree = {"filter": str(guarded.filter.path), "exempt_prompt": True}
    v1 = VllmProcessor(helpers.vllm_config(tokenizer_dir, memfree), torch.device("cpu"), False)
    params = SimpleNamespace(extra_args=None)
    quote = prompt[:4]  # the output starts quoting the prompt
    output = list(quote)
    update = SimpleNamespace(
        batch_size=1, removed=[], added=[(0, params, prompt, output)], moved=[]
    )
    v1.update_state(update)
    logits = torch.zeros(1, guarded.width)
    out = v1.apply(logits.clone())[0]
    plain = guarded.reference(prompt + quote, logits[0])
    assert torch.isneginf(plain[prompt[4]]) and not torch.isneginf(out[prompt[4]])  # lifted
    output.extend(prompt[4:])  # the whole prompt quoted: its stored continuation stays banned
    out = v1.apply(logits.clone())[0]
    assert torch.isneginf(out[source[8]])


def test_on_request_exempts_only_requests_that_ask(
    token_guarded: Any, helpers: Any, tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    guarded = token_guarded
    source = max(guarded.corpus_ids, key=len)
    prompt, quote = source[:8], source[:4]
    logits = torch.zeros(2, guarded.width)

    def run(setting: Any, asks: list[Any]) -> torch.Tensor:
        memfree = {"filter": str(guarded.filter.path), "exempt_prompt": setting}
        v1 = VllmProcessor(helpers.vllm_config(tokenizer_dir, memfree), torch.device("cpu"), False)
        added = [
            (row, SimpleNamespace(extra_args=ask), prompt, list(quote))
            for row, ask in enumerate(asks)
        ]
        v1.update_state(SimpleNamespace(batch_size=2, removed=[], added=added, moved=[]))
        return v1.apply(logits.clone())

    asks = [None, {"memfree_exempt_prompt": 1}]
    out = run("on_request", asks)
    assert torch.isneginf(out[0, prompt[4]]) and not torch.isneginf(out[1, prompt[4]])
    with caplog.at_level("WARNING", logger="vllm.memfree"):
        out = run(False, asks)
    assert torch.isneginf(out[:, prompt[4]]).all() and "asked to quote its prompt" in caplog.text
    out = run(True, [None, None])
    assert not torch.isneginf(out[:, prompt[4]]).any()
    with pytest.raises(ValueError, match="memfree_exempt_prompt"):
        VllmProcessor.validate_params(SimpleNamespace(extra_args={"memfree_exempt_prompt": "x"}))
