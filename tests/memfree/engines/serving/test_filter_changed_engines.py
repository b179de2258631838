"""Every engine gets the filter-file check through the shared guard setup: after the filter file
is rewritten in place, vLLM's V1 and V2 adapters close every guarded row (end of sequence only,
the error logged once; raising inside ``apply()`` would kill the engine), and the llama.cpp
adapter fails the step closed and raises the error from ``check()``."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from memfree.engines.llama_cpp import GuardStepError, MemFreeLlamaCppLogitsProcessor
from memfree.engines.vllm import MemFreeV1LogitsProcessor, MemFreeV2LogitsProcessor
from memfree.errors import FilterChangedError
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.testing import word_filter_from_texts
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint
from tests.memfree.engines.test_filter_changed import overwrite, zeroed_bytes

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
]


@pytest.fixture(params=["token", "word"])
def live(request: pytest.FixtureRequest, tmp_path: Path, tokenizer: Any) -> dict[str, Any]:
    """A filter of TEXTS (of this test's own: it is rewritten), and a prompt inside them."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    path = tmp_path / f"{request.param}.memfree"
    if request.param == "token":
        stored = sorted({tuple(row[i : i + 3]) for row in ids for i in range(len(row) - 2)})
        ngrams = np.asarray(stored, dtype=np.int64)
        NgramFilter.from_ngrams(
            path,
            ngrams,
            false_positive_rate=1e-9,
            metadata={
                "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
                "special_token_ids": list(special_token_ids(tokenizer)),
            },
        ).close()
    else:
        word_filter_from_texts(path, TEXTS, 3, false_positive_rate=1e-9).close()
    return {"path": path, "prompt": ids[0][:8], "zeroed": zeroed_bytes(path, tmp_path / "z")}


def _closed(row: torch.Tensor, eos: int) -> bool:
    return torch.isfinite(row).nonzero().flatten().tolist() == [eos]


def test_vllm_v1_closes_guarded_rows_after_an_in_place_rewrite(
    live: dict[str, Any],
    helpers: Any,
    tokenizer_dir: Path,
    tokenizer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = helpers.vllm_config(tokenizer_dir, {"filter": str(live["path"])})
    processor = MemFreeV1LogitsProcessor(config, torch.device("cpu"), False)
    params = SimpleNamespace(extra_args=None)
    added: list[tuple[int, Any, list[int], list[int]]] = [
        (0, params, live["prompt"], []),
        (1, params, live["prompt"][:5], []),
    ]
    processor.update_state(SimpleNamespace(batch_size=2, removed=[], added=added, moved=[]))
    width = len(tokenizer) + 4
    logits = torch.randn(2, width)
    out = processor.apply(logits.clone())
    assert torch.isneginf(out).any() and not _closed(out[0], tokenizer.eos_token_id)
    overwrite(live["path"], live["zeroed"], truncate=True)
    with caplog.at_level(logging.ERROR, logger="vllm.memfree"):
        for _ in range(2):  # sticky, and logged once
            out = processor.apply(logits.clone())
            assert all(_closed(row, tokenizer.eos_token_id) for row in out)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "vllm.memfree"]
    assert len(errors) == 1 and "renaming it over the old one" in errors[0].getMessage()
    assert isinstance(processor.active.changed.error, FilterChangedError)


def test_vllm_v2_closes_guarded_rows_after_an_in_place_rewrite(
    live: dict[str, Any], helpers: Any, tokenizer_dir: Path, tokenizer: Any
) -> None:
    config = helpers.vllm_config(tokenizer_dir, {"filter": str(live["path"])})
    width = len(tokenizer) + 4
    states = SimpleNamespace(
        device=torch.device("cpu"),
        max_num_reqs=4,
        vocab_size=width,
        all_token_ids=SimpleNamespace(gpu=torch.zeros((4, 32), dtype=torch.int32)),
        total_len=SimpleNamespace(gpu=torch.zeros(4, dtype=torch.int32)),
    )
    processor = MemFreeV2LogitsProcessor(config, states)
    committed = live["prompt"]
    states.all_token_ids.gpu[1, : len(committed)] = torch.tensor(committed)
    states.total_len.gpu[1] = len(committed)
    assert processor.add_request(1, SimpleNamespace(extra_args=None))
    processor.apply_staged_writes()
    ctx = SimpleNamespace(
        expanded_idx_mapping=torch.tensor([1]),
        idx_mapping=torch.tensor([1]),
        idx_mapping_np=np.asarray([1]),
        expanded_local_pos=torch.tensor([0]),
        input_ids=torch.tensor([committed[-1]]),
    )
    logits = torch.randn(1, width)
    assert not _closed(processor.apply(logits.clone(), ctx)[0], tokenizer.eos_token_id)
    overwrite(live["path"], live["zeroed"], truncate=False)
    assert _closed(processor.apply(logits.clone(), ctx)[0], tokenizer.eos_token_id)


def test_llama_cpp_fails_the_step_closed_and_raises_from_check(
    live: dict[str, Any], tokenizer: Any
) -> None:
    from tests.memfree.engines.serving.test_llama_cpp import FakeLlama

    eos = int(tokenizer.eos_token_id)
    guard = MemFreeLlamaCppLogitsProcessor(
        live["path"], FakeLlama(tokenizer, eos), tokenizer=tokenizer
    )
    ids = np.asarray(live["prompt"])
    scores = np.random.default_rng(0).normal(size=len(tokenizer)).astype(np.float32)
    assert np.isfinite(guard(ids, scores)).sum() > 1
    guard.check()
    overwrite(live["path"], live["zeroed"], truncate=True)
    out = guard(ids, scores)
    assert np.flatnonzero(np.isfinite(out)).tolist() == [eos]
    with pytest.raises(GuardStepError) as error:
        guard.check()
    assert isinstance(error.value.__cause__, FilterChangedError)
