"""Shared pieces of the engine adapters' tests: a token and a word filter of the tiny tokenizer's
training text, the trusted reference (the transformers guard on one row at a time, itself tested
against exact sets), an exact set of the stored n-grams, and adversarial scores that push every
row towards a stored continuation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.testing import word_filter_from_texts
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint

N = 3
WIDTH_PAD = 4  # logits wider than the vocabulary, as padded embeddings give
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "for i in range(10):\n    total += i * i\n",
]


@dataclass
class Guarded:
    """One filter with what the tests need around it."""

    unit: str
    filter: NgramFilter
    tokenizer: Any
    stored: set[tuple[int, ...]]  # token unit: the exact set (word unit: empty)
    corpus_ids: list[list[int]]  # the texts' token ids, to draw rows that hit
    eos: int

    @property
    def width(self) -> int:
        return len(self.tokenizer) + WIDTH_PAD

    def reference(self, row: list[int], scores: torch.Tensor) -> torch.Tensor:
        """The transformers guard's answer for one row (prompt and generated ids)."""
        guard = _references.setdefault(
            (id(self.filter), self.unit),
            MemFreeLogitsProcessor(self.filter, tokenizer=self.tokenizer, record_stats=False),
        )
        ids = torch.tensor([row], dtype=torch.long)
        return guard(ids, scores[None].clone())[0]

    def adversarial_scores(self, row: list[int], rng: np.random.Generator) -> torch.Tensor:
        """Random scores where each token that would complete a stored n-gram (or continue the
        texts) is far ahead."""
        scores = torch.from_numpy(rng.normal(size=self.width).astype(np.float32))
        tail = tuple(row[-(N - 1) :]) if len(row) >= N - 1 else None
        for ids in self.corpus_ids:
            for start in range(len(ids) - N + 1):
                if tail is not None and tuple(ids[start : start + N - 1]) == tail:
                    scores[ids[start + N - 1]] += 20.0
        return scores


_references: dict[tuple[int, str], MemFreeLogitsProcessor] = {}


@pytest.fixture(scope="session")
def token_guarded(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Guarded:
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    stored = {tuple(row[i : i + N]) for row in ids for i in range(len(row) - N + 1)}
    path = tmp_path_factory.mktemp("token") / "token.memfree"
    filt = NgramFilter.from_ngrams(
        path,
        sorted(stored),
        false_positive_rate=1e-9,
        metadata={
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "special_token_ids": list(special_token_ids(tokenizer)),
        },
    )
    return Guarded("token", filt, tokenizer, stored, ids, int(tokenizer.eos_token_id))


@pytest.fixture(scope="session")
def word_guarded(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Guarded:
    path = tmp_path_factory.mktemp("word") / "word.memfree"
    filt = word_filter_from_texts(path, TEXTS, N, false_positive_rate=1e-9)
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    return Guarded("word", filt, tokenizer, set(), ids, int(tokenizer.eos_token_id))


@pytest.fixture(params=["token", "word"])
def guarded(request: pytest.FixtureRequest) -> Guarded:
    return request.getfixturevalue(f"{request.param}_guarded")


def vllm_config(tokenizer_dir: Path, memfree: Any, **model: Any) -> Any:
    """A replica of the parts of vLLM's VllmConfig the adapters read."""
    fields = dict(
        tokenizer=str(tokenizer_dir),
        skip_tokenizer_init=False,
        runner_type="generate",  # what vLLM's own tokenizer loader reads, where vLLM is installed
        tokenizer_mode="auto",
        tokenizer_revision=None,
        trust_remote_code=False,
        hf_config=None,
    )
    model_config = SimpleNamespace(**{**fields, **model})
    return SimpleNamespace(additional_config={"memfree": memfree}, model_config=model_config)


def stored_emitted(guarded: Guarded, row: list[int], token: int) -> bool:
    """Whether appending ``token`` to ``row`` completes a stored token n-gram (exact set)."""
    return len(row) >= N - 1 and (*row[len(row) - N + 1 :], token) in guarded.stored


@pytest.fixture(scope="session")
def helpers() -> Any:
    """The module-level helpers above, for the test modules."""
    return SimpleNamespace(vllm_config=vllm_config, stored_emitted=stored_emitted, N=N)
