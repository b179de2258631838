"""Metrics against hand-computed values and against NLTK and editdistance called directly."""

from __future__ import annotations

import math
from pathlib import Path

import editdistance
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nltk.translate.bleu_score import sentence_bleu

from eval.metrics import (
    MetricSettings,
    bleu,
    edit_similarity,
    exact_match,
    score,
    stored_ngrams,
)
from memfree import NgramFilter

# (output, truth, BLEU computed by hand)
BLEU_TABLE = [
    ("the cat sat on the mat", "the cat sat on the mat", 1.0),
    # p1 = 5/6, p2 = 3/5, p3 = 2/4, p4 = 1/3, same length so no brevity penalty
    ("the cat sat on a mat", "the cat sat on the mat", (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25),
    # a 4-token output of a 6-token truth, all n-grams matching: brevity penalty exp(1 - 6/4)
    ("the cat sat on", "the cat sat on the mat", math.exp(1 - 6 / 4)),
    ("", "the cat", 0.0),
    ("the cat", "", 0.0),
]


@pytest.mark.parametrize("output, truth, expected", BLEU_TABLE)
def test_bleu_golden_values(output: str, truth: str, expected: float) -> None:
    assert bleu(output, truth) == pytest.approx(expected, rel=1e-12)
    if output and truth:
        assert bleu(output, truth) == sentence_bleu([truth.split()], output.split())


@pytest.mark.filterwarnings("ignore:\\s*The hypothesis contains 0 counts")
def test_bleu_without_any_four_gram_match_is_zero_as_nltk_says() -> None:
    value = bleu("a b x y", "a b c d")
    assert value < 1e-100 and value == sentence_bleu([["a", "b", "c", "d"]], ["a", "b", "x", "y"])


@pytest.mark.parametrize(
    "output, truth, unit, expected",
    [
        ("kitten", "sitting", "char", 1 - 3 / 7),
        ("", "", "char", 1.0),
        ("abc", "", "char", 0.0),
        ("def f(x): return x", "def f(y): return y", "whitespace", 1 - 2 / 4),
        ("naïve café", "naive cafe", "char", 1 - 2 / 10),
    ],
)
def test_edit_similarity_golden_values(output: str, truth: str, unit: str, expected: float) -> None:
    assert edit_similarity(output, truth, unit) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30), st.text(max_size=30))
def test_edit_similarity_matches_editdistance(output: str, truth: str) -> None:
    longest = max(len(output), len(truth))
    expected = 1.0 if longest == 0 else 1 - editdistance.eval(output, truth) / longest
    assert edit_similarity(output, truth) == pytest.approx(expected)
    assert 0.0 <= edit_similarity(output, truth) <= 1.0


def test_normalized_comparison_ignores_case_and_spacing() -> None:
    assert bleu("RETURN  A + B", "return a + b") < 0.75
    assert bleu("RETURN  A + B", "return a + b", normalize=True) == 1.0
    assert edit_similarity("X  =  1", "x = 1", normalize=True) == 1.0
    assert MetricSettings(normalize=True).normalize == "casefold"
    assert MetricSettings(normalize=False).signature() == MetricSettings().signature()


def test_word_normalized_comparison_is_the_word_units() -> None:
    """ "words": the styles vanish (case, spacing, comment markers, `_` names), as they do for the
    word filter; the words themselves still count."""
    truth = "def brew_tea(kettle, leaves):\n    return cup.steep(seconds=180)"
    styled = "# DEF _BREW_TEA(_KETTLE,  _LEAVES):\n#     RETURN _CUP.STEEP(SECONDS=180)"
    assert bleu(styled, truth, normalize="casefold") < 0.75
    assert bleu(styled, truth, normalize="words") == 1.0
    assert edit_similarity(styled, truth, normalize="words") == 1.0
    assert bleu("def brew coffee kettle leaves return cup steep seconds 180", truth, "words") < 0.75
    settings = MetricSettings(normalize="words")
    assert "norm:words-nfkc-casefold-alnum-marks-v1" in settings.signature()
    assert score(styled, truth, settings).approximately_memorized
    assert not score(styled, truth).approximately_memorized
    with pytest.raises(ValueError, match="normalize must be one of"):
        MetricSettings(normalize="stem")


def test_exact_match_and_score_signature() -> None:
    assert exact_match([1, 2, 3, 4], [1, 2, 3])
    assert not exact_match([1, 2], [1, 2, 3]) and not exact_match([1], [])
    result = score("the cat sat on the mat", "the cat sat on the mat")
    assert result.approximately_memorized and result.exact_match and result.bleu == 1.0
    assert "threshold:0.75" in result.signature and "nltk-" in result.signature
    strict = score("the cat sat on a mat", "the cat sat on the mat", MetricSettings(0.5))
    assert strict.approximately_memorized and "threshold:0.5" in strict.signature
    assert not score("the cat sat on a mat", "the cat sat on the mat").approximately_memorized
    with pytest.raises(ValueError, match="edit_unit must be one of"):
        MetricSettings(edit_unit="bytes")


def test_stored_ngrams_count_windows_reaching_into_the_output(tmp_path: Path) -> None:
    filt = NgramFilter.from_ngrams(
        tmp_path / "f.memfree",
        np.array([[1, 2, 3], [3, 4, 5], [9, 9, 9]]),
        false_positive_rate=1e-9,
        metadata={"special_token_ids": [7]},
    )
    # prompt [1 2], output [3 4 5 7 9]: windows 1 2 3 | 2 3 4 | 3 4 5 | (4 5 7, 5 7 9: special)
    found = stored_ngrams(filt, [1, 2], [3, 4, 5, 7, 9])
    assert (found.stored, found.total) == (2, 3)
    assert found.fraction == pytest.approx(2 / 3)
    assert stored_ngrams(filt, [1, 2], []).total == 0
