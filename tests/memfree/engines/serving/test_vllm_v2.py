"""The vLLM Model Runner V2 adapter against replicas of MRV2's state objects: committed ids in
per-slot device buffers, one logits row per draft token under speculative decoding (row j of a
request: committed ids then its first j drafts), rows in any order over recycled slots. Each row
must be exactly the transformers guard's answer for that context."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.engines.vllm import MemFreeV2LogitsProcessor

SLOTS, MAX_LEN = 6, 48


def _req_states(vocab: int) -> Any:
    """LogitsProcRequestState's fields (StagedWriteTensor / UvaBackedTensor expose ``.gpu``)."""
    return SimpleNamespace(
        device=torch.device("cpu"),
        max_num_reqs=SLOTS,
        vocab_size=vocab,
        all_token_ids=SimpleNamespace(gpu=torch.zeros((SLOTS, MAX_LEN), dtype=torch.int32)),
        prompt_len=SimpleNamespace(np=np.zeros(SLOTS, np.int32), gpu=torch.zeros(SLOTS)),
        prefill_len=SimpleNamespace(np=np.zeros(SLOTS, np.int32), gpu=torch.zeros(SLOTS)),
        total_len=SimpleNamespace(gpu=torch.zeros(SLOTS, dtype=torch.int32)),
    )


@pytest.mark.parametrize("allow_opt_out", [False, True])
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_each_draft_row_matches_the_core(
    data: Any, guarded: Any, helpers: Any, tokenizer_dir: Path, allow_opt_out: bool
) -> None:
    config = helpers.vllm_config(
        tokenizer_dir, {"filter": str(guarded.filter.path), "allow_opt_out": allow_opt_out}
    )
    states = _req_states(guarded.width)
    processor = MemFreeV2LogitsProcessor(config, states)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    slots = data.draw(st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=4, unique=True))
    contexts, input_ids, row_slot, local, flags = [], [], [], [], {}
    for slot in slots:
        source = guarded.corpus_ids[data.draw(st.integers(0, len(guarded.corpus_ids) - 1))]
        start = data.draw(st.integers(0, len(source) - 1))
        committed = source[start : start + data.draw(st.integers(1, 12))]
        drafts = data.draw(st.lists(st.integers(0, guarded.width - 1), max_size=3))
        if data.draw(st.booleans()):  # drafts that continue the text (stored n-grams)
            drafts = source[start + len(committed) : start + len(committed) + len(drafts)]
        states.all_token_ids.gpu[slot, : len(committed)] = torch.tensor(committed)
        states.all_token_ids.gpu[slot, len(committed) :] = 7  # stale ids past total_len
        states.total_len.gpu[slot] = len(committed)
        value = data.draw(st.sampled_from([None, 0, 1, False]))
        flags[slot] = processor.add_request(slot, SimpleNamespace(extra_args={"memfree": value}))
        assert flags[slot] == (not (allow_opt_out and value in (0, False)))
        for j in range(len(drafts) + 1):
            contexts.append(committed + drafts[:j])
            input_ids.append(committed[-1] if j == 0 else drafts[j - 1])
            row_slot.append(slot)
            local.append(j)
    processor.apply_staged_writes()
    ctx = SimpleNamespace(
        expanded_idx_mapping=torch.tensor(row_slot, dtype=torch.int32),
        idx_mapping=torch.tensor(slots, dtype=torch.int32),
        idx_mapping_np=np.asarray(slots, dtype=np.int32),
        expanded_local_pos=torch.tensor(local, dtype=torch.int32),
        input_ids=torch.tensor(input_ids, dtype=torch.int32),
        pos=torch.tensor([len(c) for c in contexts], dtype=torch.int64),
        seq_lens_upper_bound_np=np.asarray([len(c) + 1 for c in contexts]),
    )
    logits = torch.stack([guarded.adversarial_scores(c, rng) for c in contexts])
    out = processor.apply(logits.clone(), ctx)
    for row, context in enumerate(contexts):
        if not flags[row_slot[row]]:
            assert torch.equal(out[row], logits[row])
        else:
            assert torch.equal(out[row], guarded.reference(context, logits[row])), row
            assert not helpers.stored_emitted(guarded, context, int(out[row].argmax()))


def test_a_batch_of_opted_out_requests_is_left_alone(
    token_guarded: Any, helpers: Any, tokenizer_dir: Path
) -> None:
    config = helpers.vllm_config(
        tokenizer_dir, {"filter": str(token_guarded.filter.path), "allow_opt_out": True}
    )
    states = _req_states(token_guarded.width)
    processor = MemFreeV2LogitsProcessor(config, states)
    committed = token_guarded.corpus_ids[0][:5]  # inside a stored passage: the guard would ban
    states.all_token_ids.gpu[2, :5] = torch.tensor(committed)
    states.total_len.gpu[2] = 5
    ctx = SimpleNamespace(
        expanded_idx_mapping=torch.tensor([2]),
        idx_mapping=torch.tensor([2]),
        idx_mapping_np=np.asarray([2]),
        expanded_local_pos=torch.tensor([0]),
        input_ids=torch.tensor([committed[-1]]),
        pos=torch.tensor([4]),
        seq_lens_upper_bound_np=np.asarray([5]),
    )
    logits = torch.randn(1, token_guarded.width)
    assert processor.add_request(2, SimpleNamespace(extra_args={"memfree": 1})) is True
    processor.apply_staged_writes()
    assert torch.isneginf(processor.apply(logits.clone(), ctx)).any()  # guarded: bans
    assert processor.add_request(2, SimpleNamespace(extra_args={"memfree": "false"})) is False
    processor.apply_staged_writes()
    assert torch.equal(processor.apply(logits.clone(), ctx), logits)  # opted out: untouched
