"""The token guard's promise is over token ids, not text (issue 16): a stored passage spelled with
another token split passes the token guard, though the text, tokenized again, holds the stored
n-grams; the word guard reads the text and blocks it.

The count that finds it, ``created_text_ngram_counts`` (eval's ``stored_text_ngrams``), depends
on the text alone: checked with Hypothesis over random token splits against an exact set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.testing import word_filter_from_texts
from memfree.units import TOKEN, WORD, stored_ngram_counts
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint

TEXT = "the quick brown fox jumps over the lazy dog"
N = 3


def _other_split(tokenizer: Any, text: str) -> list[int]:
    """``text`` spelled one byte-level character token at a time (not the canonical split)."""
    pieces = tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = tokenizer.convert_tokens_to_ids([char for piece in pieces for char in piece])
    assert tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text
    return [int(i) for i in ids]


def _steps_banning(guard: MemFreeLogitsProcessor, ids: list[int], width: int) -> list[int]:
    """The steps of the generation ``ids`` (from nothing) where the guard bans its next token."""
    banned = []
    for step in range(1, len(ids)):
        mask, _ = guard.blocked_mask(torch.tensor([ids[:step]]), width)
        if mask[0, ids[step]]:
            banned.append(step)
    return banned


def test_the_token_guard_lets_another_split_through_and_the_word_guard_does_not(
    tmp_path: Path, tokenizer: Any
) -> None:
    canonical = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    token_filter = NgramFilter.from_ngrams(
        tmp_path / "token.memfree",
        [canonical[i : i + N] for i in range(len(canonical) - N + 1)],
        false_positive_rate=1e-9,
        metadata={
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "special_token_ids": list(special_token_ids(tokenizer)),
        },
    )
    other = _other_split(tokenizer, TEXT)
    assert other != canonical
    width = len(tokenizer)
    # The guard over the ids only (canonical=False): the canonical spelling is blocked from
    # its n-th token on ...
    token_guard = MemFreeLogitsProcessor(token_filter, tokenizer=tokenizer, canonical=False)
    assert _steps_banning(token_guard, canonical, width) == list(range(N - 1, len(canonical)))
    # ... the other split is never blocked: no stored n-gram in its ids ...
    assert _steps_banning(token_guard, other, width) == []
    assert TOKEN.created_ngram_counts(token_filter, [], other)[0] == 0
    # ... yet its text, tokenized again, holds every stored n-gram.
    again = TOKEN.text_ngrams(token_filter, tokenizer.decode(other), tokenizer)
    assert again.stored.all() and len(again.stored) == len(canonical) - N + 1
    # The word guard reads the text: it blocks the other split too, once N words are complete.
    word_filter = word_filter_from_texts(tmp_path / "word.memfree", [TEXT], N)
    word_guard = MemFreeLogitsProcessor(word_filter, tokenizer=tokenizer)
    assert _steps_banning(word_guard, other, width)
    # The default guard decodes canonically: the other split is not its text's tokenization,
    # so its first token that no tokenizer would write there is banned (issue 25).
    canonical_guard = MemFreeLogitsProcessor(token_filter, tokenizer=tokenizer)
    assert _steps_banning(canonical_guard, other, width)[:1] == [1]
    assert _steps_banning(canonical_guard, canonical, width) == list(range(N - 1, len(canonical)))
    assert WORD.created_ngram_counts(word_filter, [], other, tokenizer=tokenizer)[0] > 0
    # The count over the text tokenized again finds every one of them, whatever the split.
    stored = len(canonical) - N + 1
    for ids in (canonical, other):
        assert TOKEN.created_text_ngram_counts(token_filter, [], ids, tokenizer=tokenizer) == (
            stored,
            stored,
        )
        assert (
            stored_ngram_counts(token_filter, [], ids, tokenizer=tokenizer, text=True)[0] == stored
        )
    assert stored_ngram_counts(token_filter, [], other, tokenizer=tokenizer)[0] == 0


# ------------------------------------------------------------------------------------------------
# The count over the text: the same for every token split of the same text, and equal to the
# count over the ids when those are the text's own tokens.

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "def", "return", "self"]
STORED_TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "def return self the lazy fox",
    "over the quick dog",
]
SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def _spell(tokenizer: Any, text: str, split: bool) -> list[int]:
    """``text``'s own tokens, or one byte-level character token at a time."""
    return (
        _other_split(tokenizer, text)
        if split
        else tokenizer(text, add_special_tokens=False)["input_ids"]
    )


@pytest.fixture(scope="module")
def exact_filters(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, default_tokenizer: Any
) -> dict[str, tuple[Any, NgramFilter, set[tuple[int, ...]]]]:
    """Per tokenizer: the tokenizer, a filter of its 3-grams of STORED_TEXTS, the exact set."""
    directory = tmp_path_factory.mktemp("text-gap")
    made = {}
    for name, tok in (("byte_bpe", tokenizer), ("default", default_tokenizer)):
        ngrams = {
            tuple(ids[i : i + N])
            for text in STORED_TEXTS
            for ids in [tok(text, add_special_tokens=False)["input_ids"]]
            for i in range(len(ids) - N + 1)
        }
        filt = NgramFilter.from_ngrams(
            directory / f"{name}.memfree",
            [list(ngram) for ngram in sorted(ngrams)],
            false_positive_rate=1e-9,
            metadata={
                "tokenizer_fingerprint": tokenizer_fingerprint(tok),
                "special_token_ids": list(special_token_ids(tok)),
            },
        )
        made[name] = (tok, filt, ngrams)
    return made


@pytest.mark.parametrize("name", ["byte_bpe", "default"])
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
@given(
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=12),
    cut=st.integers(min_value=0, max_value=200),
    splits=st.lists(st.booleans(), min_size=2, max_size=2),
)
def test_the_text_count_reads_the_text_not_the_split(
    exact_filters: dict[str, Any], name: str, words: list[str], cut: int, splits: list[bool]
) -> None:
    tok, filt, exact = exact_filters[name]
    text = " ".join(words)
    cut = min(cut, len(text) - 1)  # the output holds at least one character
    prompt, output = text[:cut], text[cut:]
    counts = {
        (a, b): TOKEN.created_text_ngram_counts(
            filt,
            _spell(tok, prompt, a) if prompt else [],
            _spell(tok, output, b),
            tokenizer=tok,
        )
        for a in (False, True)
        for b in (False, True)
    }
    assert len(set(counts.values())) == 1, counts  # the split does not matter, only the text
    found = counts[splits[0], splits[1]]
    # The definition, against the exact set: the text's own tokens, and its windows holding a
    # token past the longest common prefix with the prompt text's own tokens.
    before = tok(prompt, add_special_tokens=False)["input_ids"]
    after = tok(text, add_special_tokens=False)["input_ids"]
    common = next(
        (i for i, (x, y) in enumerate(zip(before, after, strict=False)) if x != y), len(before)
    )
    reaching = [tuple(after[i : i + N]) for i in range(len(after) - N + 1) if i + N > common]
    assert found == (sum(w in exact for w in reaching), len(reaching))
    # Where the output begins a new word, the text's own tokens are the prompt's then the
    # output's, and the count equals the count over those ids (against the exact set).
    if output.startswith(" ") and prompt:
        prompt_ids = _spell(tok, prompt, False)
        ids = prompt_ids + _spell(tok, output, False)
        if ids == tok(text, add_special_tokens=False)["input_ids"]:
            windows = [
                tuple(ids[i : i + N])
                for i in range(max(len(prompt_ids) - N + 1, 0), len(ids) - N + 1)
            ]
            assert found == (sum(w in exact for w in windows), len(windows))
            assert found == TOKEN.created_ngram_counts(filt, prompt_ids, ids[len(prompt_ids) :])
    # A stored n-gram that lies wholly in the output's own words is always found.
    # (its words after the first, which the prompt may have begun; with a space before each, as
    # in the text)
    inner_words = output.split()[1:] if cut else output.split()
    inner = tok(" " * bool(cut) + " ".join(inner_words), add_special_tokens=False)["input_ids"]
    if any(tuple(inner[i : i + N]) in exact for i in range(len(inner) - N + 1)):
        assert found[0] > 0


def test_the_text_count_cuts_at_special_tokens_and_splits_characters(
    exact_filters: dict[str, Any],
) -> None:
    tok, filt, exact = exact_filters["byte_bpe"]
    stored = "the quick brown fox jumps over the lazy dog"
    own = tok(stored, add_special_tokens=False)["input_ids"]
    windows = sum(tuple(own[i : i + N]) in exact for i in range(len(own) - N + 1))
    # An end-of-sequence token inside the output: no window across it is counted (the builder
    # cuts there), the windows on each side are.
    eos = tok.eos_token_id
    half = stored.index(" jumps")
    left = tok(stored[:half], add_special_tokens=False)["input_ids"]
    right = tok(stored[half:], add_special_tokens=False)["input_ids"]
    found, total = TOKEN.created_text_ngram_counts(
        filt, [], [*left, eos, *right], special_token_ids=[eos], tokenizer=tok
    )
    assert total == (len(left) - N + 1) + (len(right) - N + 1)
    assert 0 < found < windows
    # A character cut between its bytes, the prompt ending in its first byte: the output's
    # stored n-grams are all found.
    text = "café " + stored
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = [tok.decode(ids[:k]) for k in range(len(ids) + 1)]
    cut = next(k for k in range(len(ids)) if pieces[k].endswith("\ufffd"))
    assert tok.decode(ids[cut:]).startswith("\ufffd")  # the other byte
    found, _ = TOKEN.created_text_ngram_counts(filt, ids[:cut], ids[cut:], tokenizer=tok)
    in_text = sum(tuple(ids[i : i + N]) in exact for i in range(len(ids) - N + 1))
    assert found == in_text > 0
