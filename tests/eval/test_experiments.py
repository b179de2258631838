"""End to end: a tiny model trained here memorizes a few documents; unguarded it reproduces them,
guarded it emits no stored n-gram; the records resume, and the report agrees with them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from eval.experiments import RecordLog, run_memorization
from eval.report import summarize, write_report
from eval.sampling import frequency_bucket, sample_examples
from eval.settings import ExperimentSettings
from eval.utility import run_utility
from memfree import NgramFilter
from tests.conftest import MEMORIZED_DOCUMENTS


@pytest.fixture(scope="module")
def memorized_corpus(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("memorized")
    corpus = root / "corpus"
    corpus.mkdir()
    for index, text in enumerate(MEMORIZED_DOCUMENTS):
        for copy in range(2):
            (corpus / f"doc{index}-{copy}.txt").write_text(text)
    build_filter(
        [str(corpus)],
        root / "f.memfree",
        BuildSettings(ngram_size=4, tokenizer=str(tokenizer_dir), workers=1),
        progress=False,
    )
    return root


def test_sampling_windows_and_occurrences(memorized_corpus: Path, tokenizer: Any) -> None:
    examples = sample_examples(
        [str(memorized_corpus / "corpus")], tokenizer, 4, 8, 8, seed=1, count_occurrences=True
    )
    assert len(examples) == 4
    for example in examples:
        assert len(example.prompt_ids) == len(example.truth_ids) == 8
        path, offset = example.example_id.rsplit("#", 1)
        ids = tokenizer(Path(path).read_text(), add_special_tokens=False)["input_ids"]
        assert ids[int(offset) : int(offset) + 16] == list(example.prompt_ids + example.truth_ids)
        assert example.occurrences is not None and example.occurrences >= 2  # each file twice
    assert [frequency_bucket(c) for c in (1, 2, 3, 16)] == [0, 4, 6, 16]


def test_memorization_experiment_end_to_end(
    tmp_path: Path, memorized_corpus: Path, memorizing_llama: Any, tokenizer: Any
) -> None:
    filt = NgramFilter.open(memorized_corpus / "f.memfree")
    settings = ExperimentSettings(
        corpus=(str(memorized_corpus / "corpus"),),
        num_examples=6,
        prompt_tokens=10,
        truth_tokens=20,
        batch_size=4,
    )
    out = tmp_path / "run"
    records = run_memorization(settings, out, memorizing_llama, tokenizer, filt)
    assert len(records) == 6 * 3
    by_defense = {d: [r for r in records if r["defense"] == d] for d in settings.defenses}
    plain = by_defense["none"]
    assert np.mean([r["bleu"] for r in plain]) > 0.75  # it memorized
    assert all(r["stored_ngrams"] > 0 for r in plain)
    assert all(r["stored_ngrams"] == 0 for r in by_defense["memfree"])
    assert all(r["interventions"] > 0 for r in by_defense["memfree"])
    assert np.mean([r["bleu"] for r in by_defense["memfree"]]) < np.mean([r["bleu"] for r in plain])
    assert all(r["censored"] and r["output"] == "" for r in by_defense["censor"])
    for record in records:
        assert {"prompt", "truth", "output", "defense", "style", "bleu", "edit_similarity"} <= set(
            record
        )

    # Resume: a second run finds everything done and adds nothing.
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(run_memorization(settings, out, memorizing_llama, tokenizer, filt)) == len(lines)
    # A run cut mid-line redoes only the cut record.
    (out / "records.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10])
    again = run_memorization(settings, out, memorizing_llama, tokenizer, filt)
    assert len(again) == len(lines) and RecordLog(out / "records.jsonl").records == again

    summary = write_report(out, again, settings.to_dict(), "memorized documents")
    for name in (
        "summary.json",
        "report.md",
        "scatter_bleu.png",
        "styles.png",
        "interventions.png",
    ):
        assert (out / name).stat().st_size > 0
    saved = json.loads((out / "summary.json").read_text())
    assert saved["rows"] == summarize([json.loads(line) for line in lines]) == summary["rows"]
    assert saved["buckets"] == []  # occurrences were not counted
    none_row = next(row for row in saved["rows"] if row["defense"] == "none")
    assert none_row["verbatim_rate"] == 1.0
    assert "| original | memfree |" in (out / "report.md").read_text()


def test_bucketed_sampling_counts_exactly(memorized_corpus: Path, tokenizer: Any) -> None:
    from collections import Counter

    from eval.sampling import sample_bucketed_examples

    examples = sample_bucketed_examples(
        [str(memorized_corpus / "corpus")], tokenizer, per_bucket=3, prompt_tokens=3, truth_tokens=3
    )
    windows: Counter[tuple[int, ...]] = Counter()
    for path in sorted((memorized_corpus / "corpus").iterdir()):
        ids = tokenizer(path.read_text(), add_special_tokens=False)["input_ids"]
        windows.update(tuple(ids[i : i + 6]) for i in range(len(ids) - 5))
    buckets = {frequency_bucket(count) for count in windows.values()}
    found = Counter(frequency_bucket(e.occurrences or 0) for e in examples)
    assert set(found) == buckets and max(found.values()) <= 3
    for example in examples:
        assert windows[example.prompt_ids + example.truth_ids] == example.occurrences


def test_bucket_summary() -> None:
    from eval.report import summarize_buckets

    base = {"style": "original", "stored_ngrams": 0, "approximately_memorized": False, "bleu": 0.5}
    records = [
        {**base, "bucket": 4, "defense": "none", "stored_ngrams": 3, "bleu": 0.9},
        {**base, "bucket": 4, "defense": "none"},
        {**base, "bucket": 0, "defense": "memfree"},
        {**base, "bucket": None, "defense": "none"},
    ]
    rows = summarize_buckets(records)
    assert [(r["bucket"], r["defense"], r["generations"]) for r in rows] == [
        (0, "memfree", 1),
        (4, "none", 2),
    ]
    assert rows[1]["verbatim_rate"] == 0.5 and rows[1]["mean_bleu"] == pytest.approx(0.7)
    assert rows[1]["occurrences_from"] == 2.0


def test_other_settings_refuse_the_same_directory(
    tmp_path: Path, memorized_corpus: Path, memorizing_llama: Any, tokenizer: Any
) -> None:
    filt = NgramFilter.open(memorized_corpus / "f.memfree")
    corpus = (str(memorized_corpus / "corpus"),)
    first = ExperimentSettings(corpus=corpus, num_examples=1, prompt_tokens=5, truth_tokens=5)
    run_memorization(first, tmp_path, memorizing_llama, tokenizer, filt)
    with pytest.raises(ValueError, match="holds results of other settings"):
        run_memorization(
            ExperimentSettings(corpus=corpus, num_examples=2, prompt_tokens=5, truth_tokens=5),
            tmp_path,
            memorizing_llama,
            tokenizer,
            filt,
        )


def test_styles_experiment_records_every_style(
    tmp_path: Path, memorized_corpus: Path, memorizing_llama: Any, tokenizer: Any
) -> None:
    filt = NgramFilter.open(memorized_corpus / "f.memfree")
    settings = ExperimentSettings(
        experiment="styles",
        corpus=(str(memorized_corpus / "corpus"),),
        num_examples=3,
        prompt_tokens=10,
        truth_tokens=12,
        styles=("original", "upper", "underscore_names"),
        defenses=("none", "memfree"),
    )
    records = run_memorization(settings, tmp_path, memorizing_llama, tokenizer, filt)
    assert len(records) == 3 * 3 * 2
    upper = [r for r in records if r["style"] == "upper"]
    assert all(r["prompt"] == r["prompt"].upper() for r in upper)
    assert all(r["truth"] == r["truth"].upper() for r in upper)
    assert all(r["stored_ngrams"] == 0 for r in records if r["defense"] == "memfree")


def test_utility_impact(memorized_corpus: Path, tokenizer: Any) -> None:
    filt = NgramFilter.open(memorized_corpus / "f.memfree")
    result = run_utility(
        [MEMORIZED_DOCUMENTS[0], "zzz qqq xxx vvv www yyy", "the quick brown fox jumps over"],
        tokenizer,
        filt,
    )
    assert result["texts"] == 3 and result["texts_with_stored_ngram"] == 2
    assert result["share_of_texts"] == pytest.approx(2 / 3)
    assert 0 < result["share_of_ngrams"] < 1
    assert result["examples"][0]["first_stored_ngram"]


def test_cli_eval_discoverable_styles_utility(
    tmp_path: Path,
    memorized_corpus: Path,
    memorizing_llama: Any,
    tokenizer: Any,
    tokenizer_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memfree.cli import main as cli_main

    model_dir = tmp_path / "model"
    memorizing_llama.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    common = [
        "--model",
        str(model_dir),
        "--filter",
        str(memorized_corpus / "f.memfree"),
        "--corpus",
        str(memorized_corpus / "corpus"),
        "--num-examples",
        "3",
        "--prompt-tokens",
        "10",
        "--truth-tokens",
        "12",
    ]
    out = tmp_path / "disc"
    assert cli_main(["eval", "discoverable", *common, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [row["defense"] for row in summary["rows"]] == ["none", "censor", "memfree"]
    assert (out / "report.md").exists() and (out / "records.jsonl").exists()

    out = tmp_path / "styles"
    assert (
        cli_main(
            [
                "eval",
                "styles",
                *common,
                "--out",
                str(out),
                "--styles",
                "original",
                "lower+python_comment",
                "--defenses",
                "none",
                "memfree",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "lower+python_comment" in text and "memfree" in text

    assert cli_main(["eval", "styles", "--list-styles"]) == 0
    assert "underscore_names" in capsys.readouterr().out
    assert cli_main(["eval", "styles", *common, "--styles", "nope"]) == 2
    assert "unknown style 'nope'" in capsys.readouterr().err

    texts = tmp_path / "texts.txt"
    texts.write_text(MEMORIZED_DOCUMENTS[1])
    assert (
        cli_main(
            [
                "eval",
                "utility",
                str(texts),
                "--filter",
                str(memorized_corpus / "f.memfree"),
                "--tokenizer",
                str(tokenizer_dir),
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["texts"] == 1 and result["texts_with_stored_ngram"] == 1


def test_identical_examples_are_each_counted(tmp_path: Path, tokenizer: Any) -> None:
    text = "def add(a, b):\n    return a + b\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for copy in range(4):
        (tmp_path / f"copy{copy}.txt").write_text(text)
    half = len(ids) // 2
    examples = sample_examples(
        [str(tmp_path)], tokenizer, 4, half, len(ids) - half, count_occurrences=True
    )
    assert len(examples) == 4 and len({e.example_id for e in examples}) == 4
    assert [e.occurrences for e in examples] == [4, 4, 4, 4]


@pytest.mark.parametrize(
    ("normalize", "expected"), [(False, "33c0df0292d5575d"), (True, "17e84997f90a4c64")]
)
def test_result_directories_of_older_versions_still_resume(
    normalize: bool, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings fingerprint memfree wrote before the word defense (commit 330be4c), for the
    same settings: a run started then resumes now. (Library versions pinned out of the way.)"""
    from eval.metrics import MetricSettings
    from eval.settings import settings_fingerprint as _settings_fingerprint

    monkeypatch.setattr(MetricSettings, "signature", lambda self: "pinned")
    settings = ExperimentSettings(
        experiment="styles",
        metrics=MetricSettings(normalize=normalize),
        styles=("original", "upper"),
        defenses=("none", "memfree"),
    )
    metadata = {"bits_xxh3": "0123456789abcdef", "tokenizer_fingerprint": "fedcba9876543210"}
    assert _settings_fingerprint(settings, metadata, "smollm2-135m-instruct") == expected
    words = replace(settings, metrics=MetricSettings(normalize="words"))
    assert _settings_fingerprint(words, metadata, "smollm2-135m-instruct") != expected


@pytest.mark.parametrize("experiment", ["utility", "discoverable"])
def test_cli_eval_says_what_an_unreadable_input_is(
    tmp_path: Path, experiment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from memfree.cli import main as cli_main

    NgramFilter.from_ngrams(tmp_path / "f.memfree", np.array([[1, 2, 3]]))
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    if experiment == "utility":
        arguments = ["utility", str(loop)]
    else:
        arguments = ["discoverable", "--corpus", str(loop), "--model", "x"]
    assert cli_main(["eval", *arguments, "--filter", str(tmp_path / "f.memfree")]) == 2
    assert capsys.readouterr().err == f"memfree: error: {loop}: is a symbolic link loop\n"
