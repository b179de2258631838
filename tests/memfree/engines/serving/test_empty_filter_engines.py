"""A filter that stores no n-gram (``n`` above every document, ``--min-count`` above every count)
guards nothing: every guard refuses it, naming the file, why and the fixes, unless the caller
opts in with ``allow_empty`` (a keyword argument; ``"allow_empty": true`` in vLLM's
configuration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from memfree.engines.llama_cpp import MemFreeLlamaCppLogitsProcessor
from memfree.engines.policy import ServingConfigError
from memfree.engines.setup import EmptyFilterError, GuardSetup
from memfree.engines.transformers import MemFreeLogitsProcessor as TransformersGuard
from memfree.engines.vllm import MemFreeLogitsProcessor
from memfree.errors import FilterError
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.filterfile.index.reader import IndexFilter
from memfree.testing import word_filter_from_texts
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint
from tests.memfree.engines.serving.test_llama_cpp import FakeLlama


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMFREE_FILTER", raising=False)
    monkeypatch.delenv("MEMFREE_CONFIG", raising=False)


def _metadata(tokenizer: Any) -> dict[str, Any]:
    return {
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "special_token_ids": list(special_token_ids(tokenizer)),
    }


@pytest.fixture(params=["bloom", "index", "word"])
def empty(request: pytest.FixtureRequest, tmp_path: Path, tokenizer: Any) -> Path:
    """An empty filter of each kind (a word filter of a text shorter than n words)."""
    path = tmp_path / f"{request.param}.memfree"
    nothing = np.zeros((0, 3), dtype=np.int64)
    if request.param == "bloom":
        NgramFilter.from_ngrams(path, nothing, metadata=_metadata(tokenizer)).close()
    elif request.param == "index":
        IndexFilter.from_ngrams(
            path, nothing, vocab_size=len(tokenizer), metadata=_metadata(tokenizer)
        ).close()
    else:
        word_filter_from_texts(path, ["two words"], 3).close()
    return path


MESSAGE = (
    r"{path}: the filter stores no n-gram \(0 (token|word) 3-grams\), so a guard over it would "
    r"guard nothing; rebuild it with a lower --n or --min-count .*, or, if an empty filter is "
    r"what you want, {opt_in}$"
)


def _message(path: Path, opt_in: str) -> str:
    return MESSAGE.format(path=str(path).replace(".", r"\."), opt_in=opt_in)


def test_every_guard_refuses_an_empty_filter_unless_allowed(empty: Path, tokenizer: Any) -> None:
    python = _message(empty, r"pass allow_empty=True")
    with pytest.raises(EmptyFilterError, match=python):
        GuardSetup.create(empty, tokenizer)
    with pytest.raises(EmptyFilterError, match=python):
        TransformersGuard(empty, tokenizer)
    eos = int(tokenizer.eos_token_id)
    with pytest.raises(EmptyFilterError, match=python):
        MemFreeLlamaCppLogitsProcessor(empty, FakeLlama(tokenizer, eos), tokenizer=tokenizer)
    assert issubclass(EmptyFilterError, FilterError) and issubclass(EmptyFilterError, ValueError)
    # Allowed, it is a guard that bans nothing.
    guard = TransformersGuard(empty, tokenizer, allow_empty=True, canonical=False)
    scores = torch.randn(1, len(tokenizer))
    assert torch.equal(guard(torch.tensor([[5, 6, 7]]), scores), scores)
    llama = MemFreeLlamaCppLogitsProcessor(
        empty, FakeLlama(tokenizer, eos), tokenizer=tokenizer, canonical=False, allow_empty=True
    )
    assert np.array_equal(llama(np.asarray([5, 6, 7]), scores[0].numpy()), scores[0].numpy())


def test_allow_empty_must_be_a_bool(empty: Path, tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="allow_empty must be True or False, got 'yes'"):
        GuardSetup.create(empty, tokenizer, allow_empty="yes")  # type: ignore[arg-type]


def test_vllm_refuses_an_empty_filter_in_the_configurations_terms(
    tmp_path: Path,
    tokenizer: Any,
    helpers: Any,
    tokenizer_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "empty.memfree"
    NgramFilter.from_ngrams(
        path, np.zeros((0, 3), dtype=np.int64), metadata=_metadata(tokenizer)
    ).close()

    def build(memfree: Any) -> MemFreeLogitsProcessor:
        config = helpers.vllm_config(tokenizer_dir, memfree)
        if memfree is None:
            config.additional_config = {}
        return MemFreeLogitsProcessor(config, torch.device("cpu"), False)

    fix = r"set additional_config\['memfree'\]\['allow_empty'\] to true"
    with pytest.raises(EmptyFilterError, match=_message(path, fix)):
        build({"filter": str(path)})
    assert build({"filter": str(path), "allow_empty": True}).active is not None
    with pytest.raises(ServingConfigError, match=r"\['allow_empty'\] must be true or false"):
        build({"filter": str(path), "allow_empty": "yes"})
    settings = tmp_path / "memfree.json"
    settings.write_text(json.dumps({"filter": str(path)}), encoding="utf-8")
    monkeypatch.setenv("MEMFREE_CONFIG", str(settings))
    fix = rf'add "allow_empty": true to the settings of MEMFREE_CONFIG={settings}'
    with pytest.raises(EmptyFilterError, match=_message(path, fix.replace(".", r"\."))):
        build(None)
    settings.write_text(json.dumps({"filter": str(path), "allow_empty": True}), encoding="utf-8")
    assert build(None).active is not None
    monkeypatch.delenv("MEMFREE_CONFIG")
    monkeypatch.setenv("MEMFREE_FILTER", str(path))
    fix = (
        r"set MEMFREE_CONFIG \(instead of MEMFREE_FILTER\) to a JSON file of "
        rf'\{{"filter": "{path}", "allow_empty": true\}}'
    ).replace(".memfree", r"\.memfree")
    with pytest.raises(EmptyFilterError, match=_message(path, fix)):
        build(None)
