"""Canonical decoding over Qwen 3.5's real vocabulary (151,643 byte-level tokens; its split
pattern is Qwen 2's with combining marks kept in words and out of punctuation runs).

The vocabulary is llama.cpp's test vocabulary ``ggml-vocab-qwen35.gguf`` (in the source
distribution of ``llama-cpp-python`` on PyPI; ``make setup`` takes it out into the environment's
``vocab/llama.cpp`` folder: no model hub), read by transformers with ``gguf_file=``, which
writes Qwen 3.5's pattern into the tokenizer. The tokenizer is checked against llama.cpp's own
ids for its test texts first; then rows against the definition, candidate by candidate (llama.cpp's
test texts token by token, characters of several tokens included, are in test_canonical_chars.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import CanonicalMasker
from memfree.vocab.info import TokenizerInfo
from tests.conftest import llama_cpp_tokenizer
from tests.memfree.core.test_canonical import _check_rows, _encode, _split
from tests.memfree.core.test_canonical_split import _ALPHABET, assert_cut_like_its_classes

_DIR = Path(sys.prefix, "vocab", "llama.cpp")
pytestmark = pytest.mark.skipif(
    not (_DIR / "ggml-vocab-qwen35.gguf").exists(),
    reason="needs ggml-vocab-qwen35.gguf in <venv>/vocab/llama.cpp (make setup fetches it)",
)


def _texts() -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test texts and the ids llama.cpp gives them."""
    texts = (_DIR / "ggml-vocab-qwen35.gguf.inp").read_text().split("\n__ggml_vocab_test__\n")
    lines = (_DIR / "ggml-vocab-qwen35.gguf.out").read_text().split("\n")
    return [
        (text, [int(i) for i in line.split()]) for text, line in zip(texts, lines, strict=False)
    ]


@pytest.fixture(scope="module")
def qwen35() -> tuple[Any, CanonicalMasker]:
    tokenizer = llama_cpp_tokenizer("qwen35")
    info = TokenizerInfo.of(tokenizer)
    return tokenizer, CanonicalMasker(info, [info.eos_token_id])


def test_the_tokenizer_is_llama_cpps_qwen35(qwen35: tuple[Any, CanonicalMasker]) -> None:
    tokenizer, masker = qwen35
    pairs = _texts()
    assert len(pairs) >= 50
    for text, ids in pairs:
        assert _encode(tokenizer, text) == ids, text
    assert masker.split is not None and masker.bpe.pattern == "Qwen 3.5"


@pytest.mark.parametrize(
    ("text", "how"),
    [
        ("It's HE'S we'Re  caf\u00e9 cafe\u0301 .\u0301x \u0627\u064b\u0644 \u65e5\u672c\r\n", 0),
    ],
)
def test_qwen35_allowed_iff_canonical_for_every_candidate(
    qwen35: tuple[Any, CanonicalMasker], text: str, how: int
) -> None:
    tokenizer, masker = qwen35
    ids = _split(tokenizer, text, how, 5)
    _check_rows(tokenizer, masker, [ids[:end] for end in (1, len(ids) // 2, len(ids))])


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(alphabet=_ALPHABET + "\u0301\u0308", min_size=1, max_size=9))
def test_characters_of_one_class_are_interchangeable_for_qwen35s_pattern(
    qwen35: tuple[Any, CanonicalMasker], text: str
) -> None:
    """The shapes stand on this (as for every split family in test_canonical_split.py): a
    text with each character replaced by its class's representative is cut at the same
    places; marks are where Qwen 3.5's pattern differs from Qwen 2's."""
    assert_cut_like_its_classes(qwen35[1], text)
