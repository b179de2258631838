"""AuditSettings: frozen, checked on creation, every error naming the field (and, said by the
command line, its option)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from eval.cli.flags import in_flags
from eval.settings import DEFAULT_CANARY_FORMAT, AuditSettings
from memfree.errors import SettingError


def test_defaults_are_the_papers() -> None:
    settings = AuditSettings()
    assert settings.canary_format == DEFAULT_CANARY_FORMAT
    assert settings.repetitions == (1, 2, 4, 8, 16, 32)
    assert (settings.prompt_lengths, settings.truth_tokens) == ((10, 25, 50), 50)
    assert (settings.references, settings.max_queries) == (10_000, 100_000)
    assert settings.per_bucket is None and settings.problem() is None


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AuditSettings().seed = 1  # type: ignore[misc]


# Each bad setting: the library's message (named by its field) and what `memfree audit` prints
# (named by its flag, with the old name beside the lengths' flags: the text it always printed).
BAD_SETTINGS = [
    (
        {"repetitions": ()},
        "repetitions must be integers >= 1, got nothing",
        "--repetitions must be integers >= 1, got nothing",
    ),
    (
        {"repetitions": (1, 0)},
        "repetitions must be integers >= 1, got 1 0",
        "--repetitions must be integers >= 1, got 1 0",
    ),
    ({"repetitions": [1, 2]}, "repetitions", "--repetitions"),  # a list: unhashable settings
    (
        {"canaries_per_repetition": 0},
        "canaries_per_repetition must be an integer >= 1, got 0",
        "--per-repetition must be an integer >= 1, got 0",
    ),
    ({"seed": 1.5}, "seed must be an integer, got 1.5", "--seed must be an integer, got 1.5"),
    ({"text_field": ""}, "text_field must not be empty", "--text-field must not be empty"),
    (
        {"prompt_lengths": (10, -1)},
        "prompt_lengths must be integers >= 1, got 10 -1",
        "--prompt-tokens (--k) must be integers >= 1, got 10 -1",
    ),
    (
        {"truth_tokens": 0},
        "truth_tokens must be an integer >= 1, got 0",
        "--truth-tokens (--m) must be an integer >= 1, got 0",
    ),
    ({"truth_tokens": True}, "truth_tokens", "--truth-tokens (--m)"),
    (
        {"num_examples": 0},
        "num_examples must be an integer >= 1, got 0",
        "--num-examples must be an integer >= 1, got 0",
    ),
    (
        {"per_bucket": 0},
        "per_bucket must be an integer >= 1, got 0",
        "--per-bucket must be an integer >= 1, got 0",
    ),
    (
        {"references": 0},
        "references must be an integer >= 1, got 0",
        "--references must be an integer >= 1, got 0",
    ),
    (
        {"max_queries": -5},
        "max_queries must be an integer >= 1, got -5",
        "--max-queries must be an integer >= 1, got -5",
    ),
]


@pytest.mark.parametrize(("change", "message", "said"), BAD_SETTINGS)
def test_each_bad_setting_is_refused_by_its_field_and_said_by_its_option(
    change: dict[str, Any], message: str, said: str
) -> None:
    with pytest.raises(SettingError) as refused:
        AuditSettings(**change)
    assert str(refused.value).startswith(message)
    assert refused.value.field == next(iter(change))
    assert AuditSettings().problem() is None
    assert in_flags(refused.value, old_names=True).startswith(said)


def test_to_dict_round_trips_through_json_values() -> None:
    settings = AuditSettings(repetitions=(1, 3), prompt_lengths=(4,), per_bucket=2, seed=7)
    data = settings.to_dict()
    assert data["repetitions"] == [1, 3] and data["prompt_lengths"] == [4]
    again = AuditSettings(
        **{
            **data,
            "repetitions": tuple(data["repetitions"]),
            "prompt_lengths": tuple(data["prompt_lengths"]),
        }
    )
    assert again == settings


# -- ExperimentSettings and MetricSettings: fields in the library, flags on the command line -----

EXPERIMENT_BAD_SETTINGS = [
    (
        {"defenses": ("none", "shield")},
        "defenses must be among none, censor, memfree, memfree-ids, word, got shield",
        "--defenses must be among none, censor, memfree, memfree-ids, word, got shield",
    ),
    (
        {"styles": ("seed",)},
        "styles: unknown style 'seed'; known: ",
        "--styles: unknown style 'seed'; known: ",  # a quoted value is never translated
    ),
    (
        {"num_examples": 0},
        "num_examples must be an integer >= 1, got 0",
        "--num-examples must be an integer >= 1, got 0",
    ),
    (
        {"prompt_tokens": -1},
        "prompt_tokens must be an integer >= 1, got -1",
        "--prompt-tokens must be an integer >= 1, got -1",
    ),
    (
        {"truth_tokens": 0},
        "truth_tokens must be an integer >= 1, got 0",
        "--truth-tokens must be an integer >= 1, got 0",
    ),
    (
        {"batch_size": 0},
        "batch_size must be an integer >= 1, got 0",
        "--batch-size must be an integer >= 1, got 0",
    ),
    (
        {"per_bucket": 0},
        "per_bucket must be an integer >= 1, got 0",
        "--per-bucket must be an integer >= 1, got 0",
    ),
    ({"text_field": ""}, "text_field must not be empty", "--text-field must not be empty"),
    (
        {"seed": -1},
        "seed must be from 0 to 4294967295, got -1",
        "--seed must be from 0 to 4294967295, got -1",
    ),
]


@pytest.mark.parametrize(("change", "message", "said"), EXPERIMENT_BAD_SETTINGS)
def test_experiment_settings_name_the_field_and_the_cli_the_flag(
    change: dict[str, Any], message: str, said: str
) -> None:
    from eval.settings import ExperimentSettings

    with pytest.raises(SettingError) as refused:
        ExperimentSettings(**change)
    assert str(refused.value).startswith(message)
    assert refused.value.field == next(iter(change))
    assert in_flags(refused.value).startswith(said)


def test_metric_settings_name_the_field_and_the_cli_the_flag() -> None:
    from eval.metrics import MetricSettings

    with pytest.raises(SettingError) as refused:
        MetricSettings(bleu_threshold=2.0)
    assert str(refused.value) == "bleu_threshold must be a number from 0 to 1, got 2.0"
    assert in_flags(refused.value) == "--bleu-threshold must be a number from 0 to 1, got 2.0"
    with pytest.raises(SettingError) as refused:
        MetricSettings(normalize="stem")
    assert in_flags(refused.value) == (
        "--normalize must be one of none, casefold, words, got 'stem'"
    )


def test_the_flag_table_names_fields_of_the_settings_eval_s_cli_makes() -> None:
    from eval.cli.flags import FLAGS
    from eval.metrics import MetricSettings
    from eval.settings import ExperimentSettings
    from memfree.generation import DecodingSettings

    fields = {
        field.name
        for settings in (ExperimentSettings, MetricSettings, AuditSettings, DecodingSettings)
        for field in dataclasses.fields(settings)
    }
    assert set(FLAGS) <= fields
    assert all(flag.startswith("--") for flag in FLAGS.values())


def test_other_errors_are_said_as_they_are() -> None:
    assert in_flags(ValueError("num_examples must be >= 1")) == "num_examples must be >= 1"
