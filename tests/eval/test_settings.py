"""AuditSettings: frozen, checked on creation, every error naming the command-line option."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from eval.settings import DEFAULT_CANARY_FORMAT, AuditSettings


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


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"repetitions": ()}, "--repetitions must be integers >= 1, got nothing"),
        ({"repetitions": (1, 0)}, "--repetitions must be integers >= 1, got 1 0"),
        ({"repetitions": [1, 2]}, "--repetitions"),  # a list would make the settings unhashable
        ({"canaries_per_repetition": 0}, "--per-repetition must be an integer >= 1, got 0"),
        ({"seed": 1.5}, "--seed must be an integer, got 1.5"),
        ({"text_field": ""}, "--text-field must not be empty"),
        ({"prompt_lengths": (10, -1)}, "--prompt-tokens (--k) must be integers >= 1, got 10 -1"),
        ({"truth_tokens": 0}, "--truth-tokens (--m) must be an integer >= 1, got 0"),
        ({"truth_tokens": True}, "--truth-tokens (--m)"),
        ({"num_examples": 0}, "--num-examples must be an integer >= 1, got 0"),
        ({"per_bucket": 0}, "--per-bucket must be an integer >= 1, got 0"),
        ({"references": 0}, "--references must be an integer >= 1, got 0"),
        ({"max_queries": -5}, "--max-queries must be an integer >= 1, got -5"),
    ],
)
def test_each_bad_setting_is_refused_by_its_option(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        AuditSettings(**change)
    assert str(refused.value).startswith(message)


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
