"""A pending whitespace run (issue 35): canonical decoding writes the tokenizer's own split of a
run before a word (``"\\n", "\\n"`` before ``"def"``, where ``"\\n\\n"`` ended there would be one
token), so an output cut by a length limit right after it reads back otherwise. The guard then
checks that other reading against the filter too, and allows end of sequence only where the
ids are their text's tokenization.

Checked on SmolLM2's real tokenizer: an exact example, ``exempt_prompt``, and Hypothesis walks
over allowed tokens stopped anywhere, against a filter that stores every reading of texts full of
blank lines and space runs; the walks also on a tokenizer built as Llama 3's (its split pattern
keeps newline runs whole, but splits a space run before a digit: ``"a  1"`` is ``a, " ", " ", 1``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.exempt import PromptNgrams
from memfree.engines.setup import GuardSetup
from memfree.units import stored_ngram_counts
from tests.conftest import train_split_bpe
from tests.memfree.core.test_canonical import _encode, _filter_for

CORPUS = [
    "x = 1\n\n# comment\n",
    "def f():\n\n\n    return 1\n",
    "a  1  2\n\n\nb",
    "Hello\n\nWorld",
    "1.\n\n2. Two\n \n",
    "end \n\t\n",
]


def _windows(ids: list[int], n: int) -> list[list[int]]:
    return [ids[i : i + n] for i in range(len(ids) - n + 1)]


def _guard(tokenizer: Any, path: Path, ngrams: list[list[int]]) -> GuardSetup:
    return GuardSetup.create(_filter_for(tokenizer, path, ngrams), tokenizer)


def _allowed(setup: GuardSetup, row: list[int], **kwargs: Any) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        banned, _ = setup.banned_mask(
            torch.tensor([row]), setup.masker.tokenizer.vocab_size, **kwargs
        )
    return ~banned[0].numpy()


def test_the_other_reading_of_a_pending_run_is_checked(
    default_tokenizer: Any, tmp_path: Path
) -> None:
    tokenizer = default_tokenizer
    prompt = _encode(tokenizer, "x = 1\n")
    newline = _encode(tokenizer, "\n")[0]
    ended = _encode(tokenizer, "x = 1\n\n")  # the text ended after a second newline
    assert ended[-1] != newline and prompt[-1] == newline
    # Nothing stored there: the second newline is written as the tokenizer splits a blank line.
    free = _guard(tokenizer, tmp_path / "free.memfree", [[5, 6, 7]])
    assert _allowed(free, prompt)[newline]
    assert not _allowed(free, [*prompt, newline])[tokenizer.eos_token_id]
    assert _allowed(free, _encode(tokenizer, "x = 1\n\ny"))[tokenizer.eos_token_id]
    # The other reading's last 3-gram stored: an output cut after the newline would hold it.
    stored = ended[-3:]
    guard = _guard(tokenizer, tmp_path / "guard.memfree", [stored])
    assert not _allowed(guard, prompt)[newline]
    cut = stored_ngram_counts(guard.filter, prompt, [newline], tokenizer=tokenizer, text=True)
    assert cut[0] == 1  # what the ban prevents: the text tokenized again holds it
    # exempt_prompt lifts it when the prompt holds that n-gram, as it does for the ids' own.
    quoting = [*ended, tokenizer.convert_tokens_to_ids("<|im_end|>"), *prompt]
    prompts = [PromptNgrams.of_ids(quoting, 3)]
    assert not _allowed(guard, quoting)[newline]
    assert _allowed(guard, quoting, prompts=prompts)[newline]


def test_a_split_patterns_pending_run_is_checked_too(tmp_path: Path) -> None:
    """Llama 3's pattern: ``"a  1  "`` ended there is ``..., "1", "  "``, but before a digit the
    run is ``" ", " "``. The second space is allowed (end of sequence is not), and banned where
    the other reading's last 3-gram is stored."""
    tokenizer = train_split_bpe("llama3")
    space = _encode(tokenizer, " ")[0]
    row = [*_encode(tokenizer, "a  1"), space]
    ended = _encode(tokenizer, "a  1  ")
    assert ended[:-1] == row[:-1] and ended[-1] != space
    assert _encode(tokenizer, "a  1  2")[: len(row) + 1] == [*row, space]
    free = _guard(tokenizer, tmp_path / "free.memfree", [[5, 6, 7]])
    assert _allowed(free, row)[space]
    assert not _allowed(free, [*row, space])[tokenizer.eos_token_id]
    guard = _guard(tokenizer, tmp_path / "guard.memfree", [ended[-3:]])
    assert not _allowed(guard, row)[space]
    cut = stored_ngram_counts(guard.filter, row, [space], tokenizer=tokenizer, text=True)
    assert cut[0] == 1  # what the ban prevents: the text tokenized again holds it


@pytest.fixture(scope="module", params=["smollm2", "llama3"])
def stored_readings(
    request: pytest.FixtureRequest, default_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, GuardSetup, list[int]]:
    """A guard whose filter holds the 3-grams of every prefix of CORPUS that ends in
    whitespace, tokenized as it ends there (a run's ended reading), but none of the texts' own
    tokenizations (where a run is split before what follows): a walk may write the split
    reading, and only the check of its other reading keeps it out of the text. With the tokens
    worth walking through."""
    tokenizer = default_tokenizer if request.param == "smollm2" else train_split_bpe("llama3")
    ended: set[tuple[int, ...]] = set()
    written: set[tuple[int, ...]] = set()
    pool: set[int] = set()
    for text in CORPUS:
        written.update(map(tuple, _windows(_encode(tokenizer, text), 3)))
        for end in range(1, len(text) + 1):
            ids = _encode(tokenizer, text[:end])
            pool.update(ids)
            if text[end - 1].isspace():
                ended.update(map(tuple, _windows(ids, 3)))
    stored = [list(g) for g in sorted(ended - written)]
    assert len(stored) > 5
    path = tmp_path_factory.mktemp("pending") / "readings.memfree"
    return tokenizer, _guard(tokenizer, path, stored), sorted(pool)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    prompt=st.sampled_from(["x = 1", "def f():", "a  1", "Hello", "1.", "end", "y", "2. Two"]),
    choices=st.lists(st.integers(0, 10**6), min_size=1, max_size=8),
)
def test_walks_stopped_anywhere_hold_no_stored_ngram_in_ids_or_text(
    stored_readings: tuple[Any, GuardSetup, list[int]], prompt: str, choices: list[int]
) -> None:
    tokenizer, setup, pool = stored_readings
    ids = _encode(tokenizer, prompt)
    output: list[int] = []
    for choice in choices:
        allowed = _allowed(setup, [*ids, *output])
        allowed[tokenizer.eos_token_id] = False
        # A whitespace character, the corpus's own tokens (to meet its n-grams), or any.
        tiers = [
            [t for t in pool if allowed[t] and tokenizer.decode([t]) in (" ", "\n", "\t")],
            [t for t in pool if allowed[t]],
            np.flatnonzero(allowed).tolist(),
        ]
        options = next((tier for tier in tiers[choice % 3 :] if tier), [])
        if not options:
            break
        output.append(int(options[choice % len(options)]))
        for text in (False, True):
            counts = stored_ngram_counts(setup.filter, ids, output, tokenizer=tokenizer, text=text)
            assert counts[0] == 0, (prompt, tokenizer.decode(output), text)
