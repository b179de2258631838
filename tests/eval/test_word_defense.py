"""The word guard as a fourth defense: a tiny model that copies its training documents in every
style (original, upper, lower, two spaces, `# ` comments, `_` names), a token filter and a word
filter of the original documents only, and the styles experiment under none, censor, memfree and
word. The token guard is blind to the upper-case and `_`-named copies; the word guard stops them.

The model memorized the styled copies because it was trained on them: a stand-in for a large
model's ability to rewrite what it memorized in the style a prompt asks for (the paper's §4.2).
The filters hold the original documents only, as a corpus owner's would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from eval.experiments import run_memorization
from eval.metrics import MetricSettings
from eval.report import summarize, write_report
from eval.sampling import Example
from eval.settings import ExperimentSettings
from eval.styles import get_style
from eval.utility import run_utility
from memfree import NgramFilter
from memfree.vocab.words import words
from tests.conftest import train_on_windows

DOCUMENTS = [
    "def brew_tea(kettle, leaves):\n    water = kettle.boil(minutes=4)\n"
    "    cup = water.pour(leaves)\n    return cup.steep(seconds=180)\n",
    "class Garden:\n    def plant(self, seeds):\n        for seed in seeds:\n"
    "            self.rows.append(seed.sprout())\n        return self.rows\n",
]
STYLES = ("original", "lower", "upper", "two_spaces", "python_comment", "underscore_names")
PROMPT, TRUTH = 10, 16
TOKEN_N, WORD_N = 6, 3


@pytest.fixture(scope="module")
def styled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Tokenizer, model (about 12 s of training), filters and examples."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from memfree.vocab.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("styled")
    texts = [get_style(style)(document) for style in STYLES for document in DOCUMENTS]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=500,
            special_tokens=["<|endoftext|>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<pad>"
    ).save_pretrained(root / "tokenizer")
    tokenizer = load_tokenizer(root / "tokenizer")
    model = train_on_windows(tokenizer, texts, window=24, stride=2, steps=300)
    corpus = root / "corpus"
    corpus.mkdir()
    for index, document in enumerate(DOCUMENTS):
        (corpus / f"doc{index}.txt").write_text(document)
    build_filter(
        [str(corpus)],
        root / "tokens.memfree",
        BuildSettings(ngram_size=TOKEN_N, tokenizer=str(root / "tokenizer"), workers=1),
        progress=False,
    )
    build_filter(
        [str(corpus)],
        root / "words.memfree",
        BuildSettings(ngram_size=WORD_N, unit="word", workers=1),
        progress=False,
    )
    examples = []
    for index, document in enumerate(DOCUMENTS):
        ids = tokenizer(document, add_special_tokens=False)["input_ids"]
        for offset in range(0, len(ids) - PROMPT - TRUTH + 1, 4):
            examples.append(
                Example(
                    f"doc{index}#{offset}",
                    f"doc{index}.txt",
                    tuple(ids[offset : offset + PROMPT]),
                    tuple(ids[offset + PROMPT : offset + PROMPT + TRUTH]),
                )
            )
    return {
        "root": root,
        "tokenizer": tokenizer,
        "model": model,
        "tokens": NgramFilter.open(root / "tokens.memfree"),
        "words": NgramFilter.open(root / "words.memfree"),
        "examples": examples,
    }


def _stored_word_ngrams(text: str, word_ngrams: set[tuple[str, ...]]) -> int:
    found = words(text)
    return sum(tuple(found[i : i + WORD_N]) in word_ngrams for i in range(len(found) - WORD_N + 1))


def test_word_defense_under_style_transfer(tmp_path: Path, styled: dict[str, Any]) -> None:
    settings = ExperimentSettings(
        experiment="styles",
        corpus=(str(styled["root"] / "corpus"),),
        prompt_tokens=PROMPT,
        truth_tokens=TRUTH,
        styles=STYLES,
        defenses=("none", "censor", "memfree", "word"),
        batch_size=8,
        metrics=MetricSettings(normalize="words"),
    )
    records = run_memorization(
        settings,
        tmp_path,
        styled["model"],
        styled["tokenizer"],
        styled["tokens"],
        examples=styled["examples"],
        word_filter=styled["words"],
    )
    assert len(records) == len(styled["examples"]) * len(STYLES) * 4
    rows = {(row["style"], row["defense"]): row for row in summarize(records)}
    by_key = {(r["example_id"], r["style"], r["defense"]): r for r in records}

    # The exact word n-grams of the documents: what no word-guarded output may hold.
    stored = {
        tuple(found[i : i + WORD_N])
        for found in map(words, DOCUMENTS)
        for i in range(len(found) - WORD_N + 1)
    }
    for record in records:
        assert "stored_word_ngrams" in record and record["signature"].count("norm:words-") == 1
        if record["defense"] == "word":
            assert record["stored_word_ngrams"] == 0
            # The output's own words, and those that join the prompt's end, hold none.
            joined = words(record["prompt"] + record["output"])
            before = len(words(record["prompt"]))
            start = max(before - WORD_N + 1, 0)
            assert not any(
                tuple(joined[i : i + WORD_N]) in stored
                for i in range(start, len(joined) - WORD_N + 1)
            ), record
    for style in STYLES:
        # The model copies in every style, and the word guard leaves no approximate copy: as
        # few as the token guard leaves in the original style.
        assert rows[style, "none"]["approximate_rate"] > 0.25, style
        assert rows[style, "none"]["word_verbatim_rate"] == 1.0, style
        assert rows[style, "word"]["word_verbatim_rate"] == 0.0
        assert (
            rows[style, "word"]["approximate_rate"]
            <= rows["original", "memfree"]["approximate_rate"]
        )
        assert rows[style, "word"]["mean_interventions"] > 0
    for style in ("upper", "underscore_names"):
        # Blind spots of the token guard: these copies hold no stored token n-gram, so the guard
        # never intervenes, the outputs are the unguarded ones, and they are still copies.
        assert rows[style, "none"]["verbatim_rate"] == 0.0
        assert rows[style, "memfree"]["mean_interventions"] == 0.0
        for example in styled["examples"]:
            plain = by_key[example.example_id, style, "none"]
            assert by_key[example.example_id, style, "memfree"]["output"] == plain["output"]
        assert rows[style, "memfree"]["approximate_rate"] >= 0.5
        assert rows[style, "memfree"]["word_verbatim_rate"] == 1.0
        # The counted word n-grams agree with the exact set.
        for record in records:
            if record["style"] == style and record["defense"] == "none":
                assert _stored_word_ngrams(record["prompt"] + record["output"], stored) > 0

    summary = write_report(tmp_path, records, settings.to_dict(), "styled copies")
    assert summary["rows"] == summarize(records)
    report = (tmp_path / "report.md").read_text()
    assert "≥1 stored word n-gram" in report and "| upper | word |" in report
    assert json.loads((tmp_path / "settings.json").read_text())["word_filter"].endswith(
        "words.memfree"
    )


def test_word_defense_needs_a_word_filter(tmp_path: Path, styled: dict[str, Any]) -> None:
    settings = ExperimentSettings(
        experiment="styles",
        corpus=(str(styled["root"] / "corpus"),),
        prompt_tokens=PROMPT,
        truth_tokens=TRUTH,
        defenses=("none", "word"),
    )
    args = (settings, tmp_path, styled["model"], styled["tokenizer"])
    with pytest.raises(ValueError, match="needs a word filter"):
        run_memorization(*args, styled["tokens"], examples=styled["examples"])
    with pytest.raises(ValueError, match="not a word filter"):
        run_memorization(
            *args, styled["tokens"], examples=styled["examples"], word_filter=styled["tokens"]
        )
    with pytest.raises(ValueError, match="word filter given as the token filter"):
        run_memorization(*args, styled["words"], examples=styled["examples"])
    assert not (tmp_path / "settings.json").exists()  # refused before any work
    assert not (tmp_path / "records.jsonl").exists()


def test_utility_of_a_word_filter(styled: dict[str, Any]) -> None:
    plain = "the kettle is cold today and nobody wants any tea at all"
    styled_copy = "# CUP = WATER.POUR(LEAVES)"
    result = run_utility([plain, styled_copy], None, styled["words"])
    assert result["texts"] == 2 and result["texts_with_stored_ngram"] == 1
    # "cup water pour leaves": 2 word 3-grams, both stored; the plain text's 10: none stored.
    assert (result["stored_ngrams"], result["ngrams"]) == (2, 12)
    assert result["examples"][0]["first_stored_ngram"] == "cup water pour"


def test_cli_eval_word_defense(
    tmp_path: Path, styled: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from memfree.cli import main as cli_main

    model_dir = tmp_path / "model"
    styled["model"].save_pretrained(model_dir)
    styled["tokenizer"].save_pretrained(model_dir)
    common = [
        "eval",
        "styles",
        "--model",
        str(model_dir),
        "--filter",
        str(styled["root"] / "tokens.memfree"),
        "--corpus",
        str(styled["root"] / "corpus"),
        "--num-examples",
        "2",
        "--prompt-tokens",
        str(PROMPT),
        "--truth-tokens",
        str(TRUTH),
        "--styles",
        "original",
        "upper",
    ]
    # The word defense without a word filter for a corpus other than stdlib: refused up front.
    assert cli_main([*common, "--out", str(tmp_path / "none")]) == 2
    assert "--word-filter" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    out = tmp_path / "run"
    word_filter = str(styled["root"] / "words.memfree")
    assert cli_main([*common, "--word-filter", word_filter, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [(row["style"], row["defense"]) for row in summary["rows"]] == [
        ("original", "none"),
        ("original", "memfree"),
        ("original", "word"),
        ("upper", "none"),
        ("upper", "memfree"),
        ("upper", "word"),
    ]
    assert all(
        row["word_verbatim_rate"] == 0.0 for row in summary["rows"] if row["defense"] == "word"
    )
    assert summary["settings"]["metrics"]["normalize"] == "words"
    swapped = [*common, "--word-filter", str(styled["root"] / "tokens.memfree")]
    assert cli_main([*swapped, "--out", str(tmp_path / "swapped")]) == 2
    assert "a token filter given as --word-filter" in capsys.readouterr().err
    # Checked before the model loads: a missing model is not what gets reported.
    missing_model = [*swapped[:3], str(tmp_path / "no-model"), *swapped[4:]]
    assert cli_main([*missing_model, "--out", str(tmp_path / "swapped")]) == 2
    assert "a token filter given as --word-filter" in capsys.readouterr().err
    utility = ["eval", "utility", str(styled["root"] / "corpus"), "--filter", word_filter]
    assert cli_main(utility) == 0
    assert "hold a stored 3-gram" in capsys.readouterr().out
