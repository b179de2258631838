"""Canonical decoding over Mistral's Tekken vocabulary (Mistral Nemo and later: 130,072 byte-level
BPE tokens after 1,000 special ones).

The vocabulary is ``tekken_240911.json`` from the wheel of the PyPI package ``mistral-common``
(Mistral's own; ``make setup`` downloads the wheel and takes that file out into the
environment's ``vocab/`` folder: no install, no model hub). The tokenizer is built by transformers' own ``MistralConverter``, the
converter behind ``convert_tekken_tokenizer``: a merge for every split of a token (converted from
ranks, as Llama 3's), ``ignore_merges``, Tekken's split pattern (letter runs split by case,
marks inside words and inside punctuation runs, single digits, slashes kept with a punctuation
run's newlines). Its 1,000 special tokens are named here as mistral-common names the first
five (the converter asks mistral-common for them; it is not installed). Checked first against
tiktoken's rank BPE (the reference the vocabulary was trained with), then rows against the
definition for every one of the 131,072 candidates.
"""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from memfree.core.canonical import CanonicalMasker
from memfree.vocab.info import TokenizerInfo
from tests.memfree.core.test_canonical import _check_rows, _encode, _split
from tests.memfree.core.test_canonical_advance import _check_prefixes
from tests.memfree.core.test_canonical_llama3 import _tiktoken_encode

_FILE = Path(sys.prefix, "vocab", "mistral_common", "data", "tekken_240911.json")
pytestmark = pytest.mark.skipif(
    not _FILE.exists(), reason="needs tekken_240911.json in <venv>/vocab (make setup fetches it)"
)
_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]


def tekken_tokenizer() -> Any:
    import transformers.integrations.mistral.tokenizer as mistral
    from transformers import PreTrainedTokenizerFast

    names = _SPECIAL + [f"<SPECIAL_{i}>" for i in range(len(_SPECIAL), 1000)]
    config = json.loads(_FILE.read_text(encoding="utf-8"))["config"]
    assert config["default_num_special_tokens"] == len(names)
    with mock.patch.object(mistral, "_derive_tekken_specials", lambda untyped: (names, 1000)):
        backend = mistral.MistralConverter(vocab_file=str(_FILE)).converted()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


_TEXTS = (
    "\u0627\u064b (\u064b\u0627 Aa\u0627 \u0627Aa ABCDef \u01c5x x\u01c5 a\u02b0B 12//x .\n/a ;\n\n// c\n",
    "HTTPServer camelCase XMLHttpRequest \u00c9COLE \u00e9cole http://a/b//c?x=1&y=2\n\n",
    "It's HE'S we'Re  caf\u00e9 cafe\u0301 \u65e5\u672c\u8a9e\r\n    return x  # 42\n\n    ",
)


@pytest.fixture(scope="module")
def tekken() -> tuple[Any, CanonicalMasker]:
    tokenizer = tekken_tokenizer()
    info = TokenizerInfo.of(tokenizer)
    masker = CanonicalMasker(info, [info.eos_token_id])
    assert masker.split is not None  # read through the pre-tokenizer, by shapes
    return tokenizer, masker


def test_the_built_tokenizer_is_tiktokens_rank_bpe(tekken: tuple[Any, CanonicalMasker]) -> None:
    import base64

    tokenizer, _ = tekken
    ranks = {
        base64.b64decode(entry["token_bytes"]): 1000 + rank
        for rank, entry in enumerate(json.loads(_FILE.read_text())["vocab"][: 131072 - 1000])
    }
    for text in (Path(string.__file__).read_text()[:8000], *_TEXTS):
        assert _encode(tokenizer, text) == _tiktoken_encode(tokenizer, ranks, text)


@pytest.mark.parametrize(
    ("text", "how"), [(_TEXTS[0], 0), (_TEXTS[1], 0), (_TEXTS[2], 0), (_TEXTS[0], 2)]
)
def test_tekken_allowed_iff_canonical_for_every_candidate(
    tekken: tuple[Any, CanonicalMasker], text: str, how: int
) -> None:
    tokenizer, masker = tekken
    ids = _split(tokenizer, text, how, 7)
    ends = sorted({1, len(ids) // 2, len(ids)})
    _check_rows(tokenizer, masker, [ids[:end] for end in ends])


def test_real_texts_advance_as_they_read(tekken: tuple[Any, CanonicalMasker]) -> None:
    tokenizer, masker = tekken
    for text in (Path(string.__file__).read_text()[:2000], *_TEXTS):
        assert _check_prefixes(masker.states, _encode(tokenizer, text)) > 0


@pytest.mark.parametrize("before", ["x\n\n", "y\t\t", "a = 1 "])
def test_a_special_token_spelled_as_a_rows_last_two_chunks_is_not_canonical(
    tekken: tuple[Any, CanonicalMasker], before: str
) -> None:
    """Tekken's ``<s>`` is two chunks of its pattern (``<s``, ``>``). A row that ends by
    spelling it in plain tokens after a whitespace run was read whole as canonical (a row's
    read keeps its last two chunks, and only the chunks before them were checked for added
    tokens' contents): every candidate allowed where none is. Found by hand on 2026-11-29."""
    tokenizer, masker = tekken
    ids = _encode(tokenizer, before) + [t for c in "<s>" for t in _encode(tokenizer, c)]
    assert ids != _encode(tokenizer, before + "<s>")  # the tokenizer reads the special token
    for rows in ([ids], [ids[:-1], ids]):  # read whole; advanced
        _check_rows(tokenizer, CanonicalMasker(masker.info, list(masker.end_token_ids)), rows)
