"""The token guard's promise is over token ids, not text (issue 16): a stored passage spelled with
another token split passes the token guard, though the text, tokenized again, holds the stored
n-grams; the word guard reads the text and blocks it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from memfree.filter import NgramFilter
from memfree.processor import MemFreeLogitsProcessor
from memfree.tokenizer import special_token_ids, tokenizer_fingerprint
from memfree.units import TOKEN, WORD
from memfree.words import word_filter_from_texts

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
    # The canonical spelling is blocked from its n-th token on ...
    token_guard = MemFreeLogitsProcessor(token_filter, tokenizer=tokenizer)
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
    assert WORD.created_ngram_counts(word_filter, [], other, tokenizer=tokenizer)[0] > 0
