"""The word unit's normalizer and hashes: the documented rule, and the facts the guard relies on."""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfree.filterfile.bloom.reader import NgramFilter
from memfree.testing import word_filter_from_texts
from memfree.vocab.words import (
    NORMALIZER,
    _composition_seconds,
    new_word_ngrams,
    normalize,
    starts_clean,
    text_word_hashes,
    word_hash,
    word_hashes_np,
    word_ngrams,
    words,
)


@pytest.mark.parametrize(
    ("styled", "plain"),
    [
        ("# float Q_sqrt( float NUMBER )", "float q_sqrt(float number)"),
        ("RETURN  A  +  B", "return a + b"),
        ("// self._items.append(ITEM)", "self.items.append(item)"),
        ("ＦＵＬＬ　ｗｉｄｔｈ", "full width"),  # NFKC: full-width forms
        ("ﬁnd the Straße", "find the strasse"),  # ligature, full case folding
        ("cafe\u0301", "café"),  # decomposed and precomposed
        ("\tx2 = number*0.5", "x2 number 0 5"),
    ],
)
def test_styles_normalize_to_the_same_words(styled: str, plain: str) -> None:
    assert words(styled) == words(plain)


def test_the_rule_in_detail() -> None:
    assert words("# float Q_sqrt( float NUMBER )") == ["float", "q", "sqrt", "float", "number"]
    assert words("don't stop—go!") == ["don", "t", "stop", "go"]
    assert words("x²+½") == ["x2", "1", "2"]  # NFKC turns ² into 2; ⁄ separates
    assert words("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # combining vowel signs stay in words
    assert words("日本語です。はい") == ["日本語です", "はい"]  # no spaces: runs between separators
    assert words("") == [] and words("  ...  ") == []
    assert word_ngrams("a b c d", 3) == [("a", "b", "c"), ("b", "c", "d")]
    assert NORMALIZER.endswith("-v1")


def test_new_word_ngrams_are_those_the_continuation_created() -> None:
    assert new_word_ngrams("one two thr", "one two three four", 2) == [
        ("two", "three"),
        ("three", "four"),
    ]
    assert new_word_ngrams("one two ", "one two three", 3) == [("one", "two", "three")]
    assert new_word_ngrams("one two", "one two", 2) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=20))
def test_vectorized_word_hashes_equal_the_reference(found: list[str]) -> None:
    assert word_hashes_np(found).tolist() == [word_hash(word) for word in found]


def test_word_hashes_are_pinned() -> None:
    # Filters on disk depend on these values: a change here needs a new NORMALIZER version.
    assert word_hash("float") == 0x0EA947EE3067A2EC
    from memfree.filterfile.hashing import fmix64_reference
    from memfree.vocab.words import WORD_MULTIPLIER, WORD_OFFSET

    poly = sum(byte * pow(WORD_MULTIPLIER, i, 1 << 64) for i, byte in enumerate(b"float"))
    assert word_hash("float") == fmix64_reference((poly + WORD_OFFSET) % (1 << 64))
    assert text_word_hashes("Float, FLOAT").tolist() == [word_hash("float")] * 2


# ------------------------------------------------------------------------------------------------
# Normalization can be cut before a clean character: the guard's fast path rests on this.


def _interesting() -> list[str]:
    """Characters whose normalization is not the identity or that interact with neighbours."""
    seconds = _composition_seconds()
    found = []
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if 0xD800 <= code < 0xE000:
            continue
        if (
            unicodedata.decomposition(char)
            or unicodedata.combining(char)
            or char in seconds
            or unicodedata.normalize("NFKC", char) != char
        ):
            found.append(char)
    return found


def test_cutting_before_a_clean_character_never_changes_normalization() -> None:
    interesting = _interesting()
    clean = [char for char in interesting if starts_clean(char)]
    unclean = [char for char in interesting if not starts_clean(char)]
    assert len(clean) > 3000 and len(unclean) > 500
    # Every character that begins a canonical composition, and Hangul L and LV.
    firsts = sorted(
        {
            chr(int(unicodedata.decomposition(char).split()[0], 16))
            for char in interesting
            if unicodedata.decomposition(char)
            and not unicodedata.decomposition(char).startswith("<")
        }
        | {"\u1100", "\uac00", "a", " ", "\u0301"}
    )
    failures = [
        (before, char)
        for before in firsts
        for char in clean
        if normalize(before + char) != normalize(before) + normalize(char)
    ]
    assert not failures[:5]
    # The rule is not vacuous: unclean characters do merge with what precedes them.
    assert normalize("e" + "\u0301") != normalize("e") + normalize("\u0301")
    assert normalize("\u1100" + "\u1161") != normalize("\u1100") + normalize("\u1161")


tricky = st.sampled_from(
    list("aeAEoOuU kK\u0301\u0308\u0327\u1100\u1161\u11a8\uac00ﬁ²Ⅻ\u00a8\u212b\u0bc6\u0bbe_-.")
)


@settings(max_examples=500, deadline=None)
@given(st.text(tricky, max_size=8), st.text(tricky, max_size=8))
def test_cut_rule_on_random_strings(before: str, after: str) -> None:
    if starts_clean(after):
        assert normalize(before + after) == normalize(before) + normalize(after)


# ------------------------------------------------------------------------------------------------
# Word filters


def test_word_filter_from_texts(tmp_path: Path) -> None:
    texts = ["The quick brown fox jumps.", "the QUICK brown cat"]
    filt = word_filter_from_texts(tmp_path / "w.memfree", texts, 3, min_count=1)
    assert filt.unit == "word" and filt.metadata["normalizer"] == NORMALIZER
    assert len(filt) == 4  # the quick brown (twice), quick brown fox, brown fox jumps, ...cat
    from memfree.vocab.words import ngram_hash_rows

    found = filt.contains(ngram_hash_rows([("THE", "quick", "brown"), ("fox", "jumps", "over")]))
    # ngram_hash_rows hashes words as given: callers pass normalized words.
    assert not found[1]
    assert filt.contains(ngram_hash_rows([("the", "quick", "brown")]))[0]
    twice = word_filter_from_texts(tmp_path / "w2.memfree", texts, 3, min_count=2)
    assert len(twice) == 1
    reopened = NgramFilter.open(tmp_path / "w2.memfree")
    assert reopened.unit == "word" and reopened.metadata["min_count"] == 2
    assert np.array_equal(reopened.bit_words, twice.bit_words)
