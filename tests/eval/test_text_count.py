"""Eval counts stored token n-grams in each output's text tokenized again (issue 16): a tiny Llama
trained here on a stored passage spelled one character token at a time copies it; the token guard
over the ids only (``memfree-ids``) lets the copy through (no stored n-gram in its ids), the text
column finds it, the word guard stops it, and the report and the CLI summary show the column.
The default token guard decodes canonically (issue 25): it stops the copy too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eval.experiments import run_memorization
from eval.report import summarize, write_report
from eval.sampling import Example
from eval.settings import ExperimentSettings
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.testing import word_filter_from_texts
from memfree.units import stored_ngram_counts
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint
from tests.conftest import train_on_rows
from tests.memfree.units.test_token_text_gap import TEXT, _other_split

N = 3
PROMPT = 10  # "the quick " in character tokens


@pytest.fixture(scope="module")
def spelled(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("spelled")
    canonical = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    other = _other_split(tokenizer, TEXT)
    token_filter = NgramFilter.from_ngrams(
        root / "tokens.memfree",
        [canonical[i : i + N] for i in range(len(canonical) - N + 1)],
        false_positive_rate=1e-9,
        metadata={
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "special_token_ids": list(special_token_ids(tokenizer)),
        },
    )
    return {
        "other": other,
        "model": train_on_rows(tokenizer, [other], window=len(other), steps=150),
        "tokens": token_filter,
        "words": word_filter_from_texts(root / "words.memfree", [TEXT], N),
        "example": Example("passage#0", "passage", tuple(other[:PROMPT]), tuple(other[PROMPT:])),
    }


def test_the_text_column_finds_what_the_token_guard_lets_through(
    tmp_path: Path, spelled: dict[str, Any], tokenizer: Any
) -> None:
    settings = ExperimentSettings(
        corpus=("passage",),
        prompt_tokens=PROMPT,
        truth_tokens=len(spelled["other"]) - PROMPT,
        defenses=("none", "memfree-ids", "memfree", "word"),
        batch_size=1,
    )
    records = run_memorization(
        settings,
        tmp_path,
        spelled["model"],
        tokenizer,
        spelled["tokens"],
        examples=[spelled["example"]],
        word_filter=spelled["words"],
    )
    by_defense = {record.defense: record for record in records}
    plain, token, word = by_defense["none"], by_defense["memfree-ids"], by_defense["word"]
    assert plain.exact_match  # the model copies the passage, one character token at a time
    # No stored token n-gram in its ids: the token guard never intervenes, the copy goes through.
    assert plain.stored_ngrams == token.stored_ngrams == token.interventions == 0
    assert token.output == plain.output
    # Its text, tokenized again, holds every stored n-gram past the prompt's words.
    canonical = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert token.stored_text_ngrams == plain.stored_text_ngrams > 0
    assert token.stored_text_ngrams == token.text_ngrams <= len(canonical) - N + 1
    # The word guard reads the text: it stops the copy.
    assert plain.stored_word_ngrams and word.stored_word_ngrams == 0
    assert word.interventions > 0 and not word.exact_match
    assert (
        word.stored_text_ngrams is not None and word.stored_text_ngrams < plain.stored_text_ngrams
    )

    # The canonical token guard: the prompt here is the passage's character spelling, not its
    # text's tokenization, so no token keeps prompt + output canonical: end of sequence only.
    canonical_guard = by_defense["memfree"]
    assert canonical_guard.stored_text_ngrams == canonical_guard.stored_ngrams == 0
    assert canonical_guard.output == ""

    rows = {row["defense"]: row for row in summarize(records)}
    ids_only = rows["memfree-ids"]
    assert (ids_only["verbatim_rate"], ids_only["text_verbatim_rate"]) == (0.0, 1.0)
    assert rows["memfree"]["text_verbatim_rate"] == 0.0
    write_report(tmp_path, records, settings.to_dict(), "spelled")
    report = (tmp_path / "report.md").read_text()
    assert "≥1 stored n-gram in its text tokenized again" in report
    assert "| original | memfree-ids | 1 | 0% | 100% | 100% | " in report  # ids, text, words


def test_records_of_older_runs_have_no_text_column() -> None:
    from eval.records import MemorizationRecord

    old = {
        "example_id": "a",
        "style": "original",
        "defense": "memfree",
        "output": "x",
        "bleu": 0.0,
        "edit_similarity": 0.0,
        "exact_match": False,
        "approximately_memorized": False,
        "stored_ngrams": 0,
        "interventions": 0,
        "signature": "s",
    }
    record = MemorizationRecord.from_dict(old)
    assert "stored_text_ngrams" not in record.to_dict() and record.stored_text_ngrams is None
    assert "text_verbatim_rate" not in summarize([record])[0]
    counted = MemorizationRecord.from_dict({**old, "stored_text_ngrams": 2, "text_ngrams": 5})
    assert counted.to_dict()["stored_text_ngrams"] == 2
    rates = [row["text_verbatim_rate"] for row in summarize([record, counted])]
    assert rates == [1.0]  # over the records that counted it


def test_a_guarded_completion_counts_both(spelled: dict[str, Any], tokenizer: Any) -> None:
    from memfree.engines.transformers import MemFreeLogitsProcessor
    from memfree.generation import DecodingSettings, complete

    guard = MemFreeLogitsProcessor(spelled["tokens"], tokenizer=tokenizer, canonical=False)
    prompt = list(spelled["other"][:PROMPT])
    settings = DecodingSettings(max_new_tokens=len(spelled["other"]) - PROMPT, batch_size=1)
    [completion] = complete(spelled["model"], tokenizer, [prompt], settings, guard)
    assert completion.output_ids == spelled["other"][PROMPT:]  # the ids-only guard let it through
    assert completion.stored_ngrams == 0 and completion.stored_text_ngrams


def test_the_canonical_token_guard_stops_the_other_split(
    spelled: dict[str, Any], tokenizer: Any
) -> None:
    """From a prompt that is its text's tokenization (the passage's first character), the
    model copies the passage in its character spelling; the canonical guard never lets a
    token through that the tokenizer would not write there, so its output's text, tokenized
    again, holds no stored n-gram."""
    from memfree.engines.transformers import MemFreeLogitsProcessor
    from memfree.generation import DecodingSettings, complete

    other = spelled["other"]
    prompt = [other[0]]
    assert tokenizer(tokenizer.decode(prompt), add_special_tokens=False)["input_ids"] == prompt
    settings = DecodingSettings(max_new_tokens=len(other) - 1, batch_size=1)
    [plain] = complete(spelled["model"], tokenizer, [prompt], settings)
    assert plain.output_ids == other[1:]
    copied = stored_ngram_counts(spelled["tokens"], prompt, plain.output_ids, tokenizer=tokenizer)
    in_text = stored_ngram_counts(
        spelled["tokens"], prompt, plain.output_ids, tokenizer=tokenizer, text=True
    )
    assert copied[0] == 0 and in_text[0] > 0
    guard = MemFreeLogitsProcessor(spelled["tokens"], tokenizer=tokenizer)
    [guarded] = complete(spelled["model"], tokenizer, [prompt], settings, guard)
    assert guarded.stored_ngrams == guarded.stored_text_ngrams == 0
    assert guarded.interventions and guarded.output_ids != plain.output_ids
    ids = prompt + guarded.output_ids
    assert tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"] == ids
