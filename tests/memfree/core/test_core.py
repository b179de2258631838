"""The engine-neutral guard core: exact banned masks on 5-token vocabularies, for the token and
the word unit, on CPU rows, with logits wider than the vocabulary, and the generic path of a
pybloomfiltermmap3 file giving the native filter's mask for the same n-grams."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from memfree.core import Masker, MaskerOptions, exempt_token_ids
from memfree.core.token import TokenMasker
from memfree.core.word import WordMasker
from memfree.engines.transformers import MemFreeLogitsProcessor, MemFreeWordLogitsProcessor
from memfree.errors import FilterMismatchError
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.testing import word_filter_from_texts
from memfree.vocab.bpe import CanonicalUnsupportedError
from memfree.vocab.info import TokenizerInfo

# Stored: (0 1 2), (0 1 3), (3 3 0), and (1 4 2), which holds the special token 4.
STORED = [[0, 1, 2], [0, 1, 3], [3, 3, 0], [1, 4, 2]]
ROWS = torch.tensor([[2, 0, 1], [1, 3, 3], [3, 0, 2], [2, 1, 4]])
EXPECTED = [
    [False, False, True, True, False],  # (0 1) -> 2 and 3
    [True, False, False, False, False],  # (3 3) -> 0
    [False] * 5,  # (0 2) begins nothing
    [False] * 5,  # (1 4) holds the special token 4: never checked
]


@pytest.fixture
def trigrams(tmp_path: Path) -> NgramFilter:
    return NgramFilter.from_ngrams(tmp_path / "f.memfree", STORED, false_positive_rate=1e-9)


@pytest.mark.parametrize("skip_rows", [True, False])
def test_token_masker_exact_mask(trigrams: NgramFilter, skip_rows: bool) -> None:
    masker = TokenMasker(trigrams, [4], MaskerOptions(skip_rows=skip_rows))
    assert isinstance(masker, Masker)
    mask, checked = masker.banned_mask(ROWS, 5)
    assert mask.dtype == torch.bool and mask.device.type == "cpu"
    assert mask.tolist() == EXPECTED
    assert checked[[0, 1, 3]].tolist() == [True, True, False]
    # Only the last n-1 tokens are read: the same rows cut to them give the same answer.
    assert torch.equal(masker.banned_mask(ROWS[:, 1:], 5)[0], mask)


def test_token_masker_on_logits_wider_than_the_vocabulary(trigrams: NgramFilter) -> None:
    masker = TokenMasker(trigrams, [4])
    wide, _ = masker.banned_mask(ROWS, 9)  # padded embedding rows 5..8: never stored
    assert wide.shape == (4, 9)
    assert wide[:, :5].tolist() == EXPECTED
    assert not wide[:, 5:].any()


def test_token_masker_exemptions_and_short_rows(tmp_path: Path) -> None:
    filt = NgramFilter.from_ngrams(tmp_path / "u.memfree", [[0, 2], [0, 3]])
    masker = TokenMasker(filt, [3])
    mask, checked = masker.banned_mask(torch.tensor([[0], [3]]), 5)
    # 3 is exempt: never banned, and a context holding it completes nothing.
    assert mask.tolist() == [[False, False, True, False, False], [False] * 5]
    assert checked.tolist() == [True, False]
    empty, none = masker.banned_mask(torch.zeros(2, 0, dtype=torch.long), 5)
    assert not empty.any() and empty.shape == (2, 5) and not none.any()


def test_exempt_ids_are_those_the_builder_cut_at(tmp_path: Path) -> None:
    recorded = NgramFilter.from_ngrams(
        tmp_path / "r.memfree", [[0, 1]], metadata={"special_token_ids": [4, 7]}
    )
    assert exempt_token_ids(recorded, [7, 3, 4, 4]) == (4, 7)
    hand_made = NgramFilter.from_ngrams(tmp_path / "h.memfree", [[0, 1]])
    assert exempt_token_ids(hand_made, [7, 3]) == (3, 7)


def test_generic_path_of_a_pybloom_file_equals_the_native_mask(
    tmp_path: Path, trigrams: NgramFilter
) -> None:
    from memfree.filterfile.pybloom.reader import PybloomWriter

    writer = PybloomWriter(10, 1e-9, 0)
    writer.add_ngrams(np.asarray(STORED))
    writer.write(tmp_path / "f.bloom", {"n": 3, "unit": "token", "hash_seed": 0}, len(STORED))
    interchange = NgramFilter.open(tmp_path / "f.bloom")
    assert interchange.blocked_bits() is None  # answers through contains() only
    generic = TokenMasker(interchange, [4])
    native = TokenMasker(trigrams, [4])
    for width in (5, 7):
        mask, checked = generic.banned_mask(ROWS, width)
        assert torch.equal(mask, native.banned_mask(ROWS, width)[0])
        assert mask[:, :5].tolist() == EXPECTED and not mask[:, 5:].any()
        assert checked.tolist() == [True, True, True, False]  # no prefix section to skip by


def test_token_masker_copies_and_pickles(trigrams: NgramFilter) -> None:
    masker = TokenMasker(trigrams, [4])
    masker.banned_mask(ROWS, 5)  # builds the CPU tables
    for clone in (copy.deepcopy(masker), pickle.loads(pickle.dumps(masker))):
        assert clone.banned_mask(ROWS, 5)[0].tolist() == EXPECTED


# ------------------------------------------------------------------------------------------------
# The word unit, on a 5-token vocabulary: </s>, " foo", " bar", " ba", "r"


@pytest.fixture(scope="module")
def five_tokens() -> Any:
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"</s>": 0, "▁foo": 1, "▁bar": 2, "▁ba": 3, "r": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    backend.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")


def test_word_masker_exact_mask(tmp_path: Path, five_tokens: Any) -> None:
    filt = word_filter_from_texts(tmp_path / "w.memfree", ["Foo, bar!"], 2)  # stores (foo bar)
    masker = WordMasker(filt, TokenizerInfo.of(five_tokens), [0])
    assert isinstance(masker, Masker)
    rows = torch.tensor([[0, 1], [1, 3], [0, 2]])  # " foo", " foo ba", " bar"
    mask, checked = masker.banned_mask(rows, 7)  # ids 5 and 6: padded rows that add no text
    assert mask.tolist() == [
        [False, False, True, False, False, False, False],  # " bar" makes (foo bar)
        [False, False, False, False, True, False, False],  # "r" turns "ba" into "bar"
        [False] * 7,  # (bar ...) begins nothing
    ]
    assert checked[:2].tolist() == [True, True]
    # The same rows again (now extended from the cached row states) give the same mask.
    assert torch.equal(masker.banned_mask(rows, 7)[0], mask)
    clone = pickle.loads(pickle.dumps(masker))
    assert torch.equal(clone.banned_mask(rows, 7)[0], mask)


def test_the_filter_unit_picks_the_core(tmp_path: Path, five_tokens: Any) -> None:
    words_filter = word_filter_from_texts(tmp_path / "w.memfree", ["foo bar"], 2)
    tokens_filter = NgramFilter.from_ngrams(tmp_path / "t.memfree", [[1, 2]])
    word_guard = MemFreeLogitsProcessor(words_filter, five_tokens)
    with pytest.raises(CanonicalUnsupportedError, match="word filter"):  # a WordLevel model
        MemFreeLogitsProcessor(tokens_filter, five_tokens)
    token_guard = MemFreeLogitsProcessor(tokens_filter, five_tokens, canonical=False)
    assert isinstance(word_guard.masker, WordMasker) and word_guard.unit.name == "word"
    assert isinstance(token_guard.masker, TokenMasker) and token_guard.unit.name == "token"
    assert "MemFreeWordLogitsProcessor" in repr(word_guard)
    assert "MemFreeWordLogitsProcessor" not in repr(token_guard)
    assert word_guard.tokenizer is five_tokens and token_guard.tokenizer is None
    with pytest.raises(FilterMismatchError, match="is a token filter"):
        MemFreeWordLogitsProcessor(tokens_filter, five_tokens)
