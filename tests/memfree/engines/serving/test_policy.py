"""The serving policy and the engines' configuration errors: every request guarded unless the
operator allows opt-out; bad values refused with errors that name the setting."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from memfree.engines.policy import ServingConfig, ServingConfigError, requested_guard
from memfree.engines.vllm import MemFreeV1LogitsProcessor, MemFreeV2LogitsProcessor
from memfree.engines.vllm_common import RequestPolicy
from memfree.errors import FilterError, FilterMismatchError
from memfree.filterfile.native import NgramFilter


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, False),
        (1, True),
        (True, True),
        (False, False),
        ("0", False),
        ("TRUE", True),
        (" false ", False),
        ("1", True),
    ],
)
def test_accepted_opt_out_values(value: Any, expected: bool) -> None:
    assert requested_guard({"memfree": value}) is expected
    for processor in (MemFreeV1LogitsProcessor, MemFreeV2LogitsProcessor):
        processor.validate_params(SimpleNamespace(extra_args={"memfree": value}))


@pytest.mark.parametrize("value", [2, -1, "yes", "off", None, 0.0, [], {}])
def test_refused_opt_out_values(value: Any) -> None:
    for processor in (MemFreeV1LogitsProcessor, MemFreeV2LogitsProcessor):
        with pytest.raises(ValueError, match="must be 0, 1, true or false"):
            processor.validate_params(SimpleNamespace(extra_args={"memfree": value}))


def test_no_request_switches_the_guard_off_unless_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strict = RequestPolicy(ServingConfig("f.memfree"))
    loose = RequestPolicy(ServingConfig("f.memfree", allow_opt_out=True))
    off, on, unsaid = ({"memfree": 0}, {"memfree": 1}, {"other": 1})
    for extra in (off, on, unsaid, None, {"memfree": "maybe"}):
        assert strict.guards(SimpleNamespace(extra_args=extra))
    assert "stays guarded" in caplog.text
    assert not loose.guards(SimpleNamespace(extra_args=off))
    assert loose.guards(SimpleNamespace(extra_args=on))
    assert loose.guards(SimpleNamespace(extra_args=unsaid))
    assert loose.guards(SimpleNamespace(extra_args={"memfree": "maybe"}))  # refused, guarded


def test_canonical_is_an_operator_setting() -> None:
    assert ServingConfig.parse({"memfree": {"filter": "f"}}).canonical is None
    assert ServingConfig.parse({"memfree": {"filter": "f", "canonical": False}}).canonical is False


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "has no configuration"),
        ("x.memfree", "must be a mapping"),
        ({}, r"\['filter'\] must be the path"),
        ({"filter": "f", "allow_optout": True}, "unknown key"),
        ({"filter": "f", "allow_opt_out": "yes"}, "must be true or false"),
        ({"filter": "f", "ngram_size": 0}, "positive integer"),
        ({"filter": "f", "canonical": "no"}, r"\['canonical'\] must be true or false"),
    ],
)
def test_bad_configurations_name_the_setting(config: Any, message: str) -> None:
    with pytest.raises(ServingConfigError, match=message):
        ServingConfig.parse({"memfree": config} if config is not None else {})


def test_the_engine_refuses_a_filter_that_does_not_fit(
    tmp_path: Path, token_guarded: Any, helpers: Any, tokenizer_dir: Path
) -> None:
    def build(memfree: Any, **model: Any) -> Any:
        return MemFreeV1LogitsProcessor(
            helpers.vllm_config(tokenizer_dir, memfree, **model), torch.device("cpu"), False
        )

    with pytest.raises(FilterError, match=r"no-such\.memfree"):
        build({"filter": str(tmp_path / "no-such.memfree")})
    other = NgramFilter.from_ngrams(
        tmp_path / "other.memfree", [[1, 2, 3]], metadata={"tokenizer_fingerprint": "0" * 16}
    )
    with pytest.raises(FilterMismatchError, match="fingerprint"):
        build({"filter": str(other.path)})
    with pytest.raises(FilterMismatchError, match="ngram_size=4"):
        build({"filter": str(token_guarded.filter.path), "ngram_size": 4})
    with pytest.raises(ServingConfigError, match="skip_tokenizer_init"):
        config = helpers.vllm_config(tokenizer_dir, {"filter": str(token_guarded.filter.path)})
        config.model_config.skip_tokenizer_init = True
        MemFreeV1LogitsProcessor(config, torch.device("cpu"), False)
