"""The defense registry: every place that needs a defense's name, meaning or needs asks it; and
a run counts each output's stored n-grams once, however many defenses share it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from eval.defenses import (
    DEFENSE_NAMES,
    defense_order,
    find_defense,
    generation_groups,
    get_defense,
    is_guarded,
)
from eval.settings import DEFENSES, GUARDS, ExperimentSettings
from memfree import NgramFilter
from memfree.units import TOKEN, WORD
from tests.conftest import MEMORIZED_DOCUMENTS


def test_the_registry_names_each_defense_and_what_it_needs() -> None:
    assert DEFENSE_NAMES == ("none", "censor", "memfree", "memfree-ids", "word") == DEFENSES
    assert GUARDS == ("memfree", "memfree-ids", "word")
    assert [get_defense(name).guard_unit for name in DEFENSE_NAMES] == [
        None,
        None,
        TOKEN,
        TOKEN,
        WORD,
    ]
    # Both token guards; only memfree-ids turns canonical decoding off.
    assert [get_defense(name).canonical for name in GUARDS[:2]] == [True, False]
    assert [name for name in DEFENSE_NAMES if get_defense(name).censors] == ["censor"]
    assert [name for name in DEFENSE_NAMES if get_defense(name).needs_word_filter] == ["word"]
    assert find_defense(guard_unit=None).name == "none"
    assert find_defense(guard_unit=TOKEN).name == "memfree"
    assert not is_guarded("censor") and is_guarded("word") and not is_guarded("unknown")
    assert [defense_order(name) for name in ("word", "none", "other")] == [4, 0, 5]
    with pytest.raises(ValueError, match=r"unknown defense 'guard'; known: none, censor, "):
        get_defense("guard")


@pytest.mark.parametrize(
    ("defenses", "groups"),
    [
        (("none", "censor", "memfree"), [("none", "censor"), ("memfree",)]),
        # The unguarded ones keep the settings' order (their records' order); guards report order.
        (("word", "censor", "memfree", "none"), [("censor", "none"), ("memfree",), ("word",)]),
        (
            ("memfree-ids", "word", "memfree"),
            [("memfree",), ("memfree-ids",), ("word",)],
        ),
        (("memfree",), [("memfree",)]),
        (("censor",), [("censor",)]),
    ],
)
def test_generation_groups(defenses: tuple[str, ...], groups: list[tuple[str, ...]]) -> None:
    assert generation_groups(defenses) == groups


def test_the_cli_help_and_the_report_describe_the_defenses_from_the_registry() -> None:
    from eval.cli.evaluate_options import _defenses_help

    assert _defenses_help() == (
        "none; censor (reject outputs holding a stored n-gram); memfree (the token guard); "
        "memfree-ids (the token guard over the ids only); word (the word guard, needs "
        "--word-filter)"
    )
    from eval.report import _table_lines
    from eval.summary import Summary

    lines = _table_lines(Summary(settings={}, signatures=(), rows=(), buckets=()), 0)
    assert (
        "Defenses: *none* (the model as is), *censor* (a generation holding a stored n-gram is "
        "rejected and scores as empty), *memfree* (the token guard with canonical decoding: its "
        "ids are their text's tokenization), *memfree-ids* (the token guard without canonical "
        "decoding: its promise holds over the ids, not over their text tokenized again), "
        "*word* (the word guard: "
        "n-grams of normalized words, whatever their case, spacing or punctuation)."
    ) in lines


def test_an_unknown_defense_is_named_by_its_field() -> None:
    from memfree.errors import SettingError

    with pytest.raises(
        SettingError,
        match=r"^defenses must be among none, censor, memfree, memfree-ids, word, got shield$",
    ):
        ExperimentSettings(defenses=("none", "shield"))


@pytest.fixture(scope="module")
def filtered(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("defenses")
    corpus = root / "corpus"
    corpus.mkdir()
    for index, text in enumerate(MEMORIZED_DOCUMENTS):
        (corpus / f"doc{index}.txt").write_text(text)
    build_filter(
        [str(corpus)],
        root / "f.memfree",
        BuildSettings(ngram_size=4, tokenizer=str(tokenizer_dir), workers=1),
        progress=False,
    )
    return root


def test_each_output_is_counted_once_for_the_defenses_that_share_it(
    filtered: Path,
    memorizing_llama: Any,
    tokenizer: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import eval.batches
    import memfree.generation
    from eval.experiments import run_memorization

    calls: list[bool] = []  # text=... of each count
    count = eval.batches.stored_ngrams

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(bool(kwargs.get("text")))
        return count(*args, **kwargs)

    asked: list[dict[str, Any]] = []
    complete = memfree.generation.complete

    def completing(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs)
        return complete(*args, **kwargs)

    monkeypatch.setattr(eval.batches, "stored_ngrams", counting)
    monkeypatch.setattr(memfree.generation, "complete", completing)
    settings = ExperimentSettings(
        corpus=(str(filtered / "corpus"),),
        num_examples=3,
        prompt_tokens=8,
        truth_tokens=12,
        defenses=("none", "censor"),
    )
    ngram_filter = NgramFilter.open(filtered / "f.memfree")
    records = run_memorization(settings, tmp_path, memorizing_llama, tokenizer, ngram_filter)
    assert asked and all("ngram_filter" not in kwargs for kwargs in asked)
    assert all(kwargs.get("count_stored") is False for kwargs in asked)
    censored = sum(bool(record.censored) for record in records)
    assert censored > 0  # it memorized: the censor withheld some
    # One count of the ids per output; one of the text per output and per way it is shown
    # (withheld, or not): never one per defense.
    assert calls.count(False) == 3
    assert calls.count(True) == 3 + censored
    by_example = {(r.example_id, r.defense): r for r in records}
    for record in records:
        if record.defense == "censor" and not record.censored:
            plain = by_example[record.example_id, "none"].to_dict()
            assert {**plain, "defense": "censor"} == record.to_dict()
