"""Units: the filter's ``unit`` picks the builder's encoder (the same ids and hashes as before),
the header and configuration fields, the build-time tokenizer check, and the count of n-grams an
output created."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from memfree.errors import FilterMismatchError
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.filterfile.index.reader import IndexFilter
from memfree.testing import word_filter_from_texts
from memfree.units import (
    TOKEN,
    UNIT_NAMES,
    WORD,
    BatchEncoder,
    TokenizerPayload,
    WordEncoder,
    WordPayload,
    get_unit,
    unit_of,
)
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint
from memfree.vocab.words import NORMALIZER, text_word_hashes, word_metadata

TEXTS = ["def add(a, b):\n    return a + b\n", "", "the quick brown fox ünïcode", "x" * 300]


def test_units_by_name_and_by_filter(tmp_path: Path) -> None:
    assert UNIT_NAMES == ("token", "word")
    assert get_unit("token") is TOKEN and get_unit("word") is WORD
    with pytest.raises(ValueError, match=r"unknown unit 'line'.*token, word"):
        get_unit("line")
    assert unit_of(NgramFilter.from_ngrams(tmp_path / "t.memfree", [[1, 2]])) is TOKEN
    assert unit_of(word_filter_from_texts(tmp_path / "w.memfree", ["a b"], 2)) is WORD
    odd = SimpleNamespace(unit="line", path=tmp_path / "o.memfree")  # a newer memfree's filter
    with pytest.raises(ValueError, match=r"o\.memfree: stores n-grams of unit 'line'.*upgrade"):
        unit_of(odd)  # type: ignore[arg-type]


def test_token_encoder_gives_the_tokenizer_ids(tokenizer: Any) -> None:
    payload = TokenizerPayload.from_tokenizer(tokenizer)
    assert payload.backend_json is not None and payload.pickled is None  # a fast tokenizer
    encoder = pickle.loads(pickle.dumps(payload)).encoder()  # as a worker receives it
    assert isinstance(encoder, BatchEncoder)
    assert encoder.special_ids.dtype == np.uint32
    assert encoder.special_ids.tolist() == list(special_token_ids(tokenizer))
    expected = tokenizer(TEXTS, add_special_tokens=False)["input_ids"]
    encoded = encoder.encode(TEXTS)
    assert [row.dtype for row in encoded] == [np.dtype(np.uint32)] * len(TEXTS)
    assert [row.tolist() for row in encoded] == expected
    # A tokenizer without a backend travels pickled and encodes the same.
    slow = TokenizerPayload(None, pickle.dumps(tokenizer), payload.special_ids).encoder()
    assert [row.tolist() for row in slow.encode(TEXTS)] == expected
    with pytest.raises(ValueError, match="needs a backend tokenizer or a pickled"):
        BatchEncoder(None, None)


def test_word_encoder_gives_word_hashes() -> None:
    encoder = pickle.loads(pickle.dumps(WordPayload(NORMALIZER))).encoder()
    assert isinstance(encoder, WordEncoder)
    assert encoder.special_ids.dtype == np.uint32 and encoder.special_ids.size == 0
    encoded = encoder.encode(TEXTS)
    assert [row.dtype for row in encoded] == [np.dtype(np.uint64)] * len(TEXTS)
    assert all(
        np.array_equal(row, text_word_hashes(text))
        for row, text in zip(encoded, TEXTS, strict=True)
    )
    assert encoded[1].size == 0 and encoded[0].size == 7  # def add a b return a b


def test_build_parts(tokenizer: Any, tokenizer_dir: Path) -> None:
    token = TOKEN.build_parts(str(tokenizer_dir), tokenizer)
    fingerprint = tokenizer_fingerprint(tokenizer)
    special = list(special_token_ids(tokenizer))
    assert token.header_fields == {
        "unit": "token",
        "tokenizer": tokenizer.name_or_path,
        "tokenizer_fingerprint": fingerprint,
        "vocab_size": len(tokenizer),
        "special_token_ids": special,
    }
    assert token.config_fields == {
        "tokenizer_fingerprint": fingerprint,
        "normalizer": None,
        "special_ids": special,
    }
    assert token.progress_label == "tokenize+hash"
    assert isinstance(token.payload, TokenizerPayload)
    loaded = TOKEN.build_parts(tokenizer_dir)  # no tokenizer given: the named one is loaded
    assert loaded.header_fields["tokenizer_fingerprint"] == fingerprint
    assert TOKEN.tokenizer_problem(None) is None
    word = WORD.build_parts()
    assert word.header_fields == word_metadata() and word.header_fields["unit"] == "word"
    assert word.config_fields == {
        "tokenizer_fingerprint": None,
        "normalizer": NORMALIZER,
        "special_ids": [],
    }
    assert word.payload == WordPayload(NORMALIZER) and word.progress_label == "normalize+hash"
    problem = "--unit word needs no tokenizer"
    assert problem in (WORD.tokenizer_problem("gpt2") or "")
    assert problem in (WORD.tokenizer_problem(None, tokenizer) or "")
    with pytest.raises(ValueError, match=problem):
        WORD.build_parts(tokenizer=tokenizer)


def test_created_ngram_counts(tmp_path: Path, tokenizer: Any) -> None:
    tokens = NgramFilter.from_ngrams(
        tmp_path / "t.memfree", [[1, 2, 3], [2, 3, 4]], false_positive_rate=1e-9
    )
    # windows reaching into the output (5, 4): (2 3 5), (3 5 4); then with (3 4) output ...
    assert TOKEN.created_ngram_counts(tokens, [1, 2, 3], [5, 4]) == (0, 2)
    assert TOKEN.created_ngram_counts(tokens, [1, 2], [3, 4]) == (2, 2)
    assert TOKEN.created_ngram_counts(tokens, [1, 2], [3, 4], special_token_ids=[1]) == (1, 1)
    assert TOKEN.created_ngram_counts(tokens, [1, 2], []) == (0, 0)
    words = word_filter_from_texts(tmp_path / "w.memfree", ["the quick brown fox"], 2)
    prompt = tokenizer("the quick", add_special_tokens=False)["input_ids"]
    output = tokenizer(" brown cat", add_special_tokens=False)["input_ids"]
    # created: (quick brown), (brown cat); stored: (quick brown)
    assert WORD.created_ngram_counts(words, prompt, output, tokenizer=tokenizer) == (1, 2)
    assert WORD.created_ngram_counts(words, prompt, [], tokenizer=tokenizer) == (0, 0)
    with pytest.raises(ValueError, match="needs the tokenizer"):
        WORD.created_ngram_counts(words, prompt, output)


def test_a_unit_refuses_a_filter_of_the_other_unit(tmp_path: Path, tokenizer: Any) -> None:
    words = word_filter_from_texts(tmp_path / "w.memfree", ["a b"], 2)
    tokens = NgramFilter.from_ngrams(tmp_path / "t.memfree", [[1, 2]])
    with pytest.raises(FilterMismatchError, match="is a word filter; the token guard"):
        TOKEN.masker(words, tokenizer, [])
    with pytest.raises(FilterMismatchError, match="is a token filter; the word guard"):
        WORD.masker(tokens, tokenizer, [])
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        WORD.masker(words, None, [])


def test_the_unit_decides_canonical_decoding(tmp_path: Path, tokenizer: Any) -> None:
    """The token unit turns canonical decoding on where there is a tokenizer and builds the
    text-promise masker itself; the word unit never does (its promise is over the text) and
    refuses to be asked."""
    from memfree.core.text_promise import TextPromiseMasker
    from memfree.core.token_index import IndexMasker
    from memfree.testing import token_filter_from_ngrams
    from memfree.vocab.info import TokenizerInfo

    info = TokenizerInfo.of(tokenizer)
    assert TOKEN.text_promise(None, info) is True and TOKEN.text_promise(None, None) is False
    assert TOKEN.text_promise(False, info) is False
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        TOKEN.text_promise(True, None)
    assert WORD.text_promise(None, info) is False and WORD.text_promise(False, info) is False
    with pytest.raises(ValueError, match="applies to token filters"):
        WORD.text_promise(True, info)
    tokens = token_filter_from_ngrams(tmp_path / "t.memfree", [[1, 2, 3]], tokenizer)
    plain = TOKEN.masker(tokens, info, [])
    guarded = TOKEN.masker(tokens, info, [], canonical=True, end_token_ids=[0])
    assert not isinstance(plain, TextPromiseMasker) and isinstance(guarded, TextPromiseMasker)
    index = IndexFilter.from_ngrams(tmp_path / "i.memfree", [[1, 2, 3]], vocab_size=len(tokenizer))
    assert isinstance(TOKEN.masker(index, None, []), IndexMasker)
    words = word_filter_from_texts(tmp_path / "w.memfree", ["a b"], 2)
    with pytest.raises(ValueError, match="applies to token filters"):
        WORD.masker(words, info, [], canonical=True)
