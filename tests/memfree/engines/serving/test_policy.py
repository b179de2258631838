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
from memfree.filterfile.bloom.reader import NgramFilter


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
        ({}, r"\['memfree'\] is empty \(\{\}\): .*present but empty is refused"),
        ({"allow_opt_out": True}, r"\['filter'\] must be the path"),
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


PRESENT_BUT_EMPTY = "present but empty is refused rather than leave the engine unguarded"


@pytest.mark.parametrize(
    ("additional_config", "message"),
    [
        ({"memfree": None}, r"^additional_config\['memfree'\] is null: "),
        (SimpleNamespace(memfree=None), r"^additional_config\['memfree'\] is null: "),
        ({"memfree": {}}, r"^additional_config\['memfree'\] is empty \(\{\}\): "),
    ],
)
def test_a_present_but_empty_configuration_is_refused(additional_config: Any, message: str) -> None:
    with pytest.raises(ServingConfigError, match=message + f".*{PRESENT_BUT_EMPTY}.*PATH"):
        ServingConfig.find(additional_config, environ={})


@pytest.mark.parametrize(
    "environ",
    [
        {"MEMFREE_FILTER": ""},
        {"MEMFREE_FILTER": "  "},
        {"MEMFREE_CONFIG": ""},
        {"MEMFREE_CONFIG": "", "MEMFREE_FILTER": "f.memfree"},  # the empty one is named
    ],
)
def test_an_exported_but_empty_variable_is_refused(environ: dict[str, str]) -> None:
    name = next(key for key, value in environ.items() if not value.strip())
    message = (
        rf"^{name} is set but empty \({name}='\s*'\): .*{PRESENT_BUT_EMPTY}; set {name} to the "
        rf"path of .*, or unset it \(`unset {name}`\) to run without the guard$"
    )
    with pytest.raises(ServingConfigError, match=message):
        ServingConfig.find({}, environ=environ)
    assert ServingConfig.find({}, environ={}) is None  # nothing set: not configured


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("null", rf"=\S+ is null: .*{PRESENT_BUT_EMPTY}"),
        ("{}", rf"=\S+ is empty \(\{{\}}\): .*{PRESENT_BUT_EMPTY}"),
        ("[1, 2]", r"=\S+ must hold a JSON object of settings like \{.*\}, got a list \[1, 2\]$"),
        ('"f.memfree"', r"=\S+ must hold a JSON object of settings .*got a string 'f.memfree'$"),
        ('{"filter": "f", "log_interval_s": NaN}', r"=\S+\['log_interval_s'\] must be a finite"),
        ('{"filter": "f", "log_interval_s": Infinity}', r"=\S+\['log_interval_s'\] .* got inf$"),
        ('{"filter": "f", "allow_opt_out": "yes"}', r"=\S+json\['allow_opt_out'\] must be"),
    ],
)
def test_a_settings_file_is_refused_in_its_own_terms(
    tmp_path: Path, content: str, message: str
) -> None:
    """The file holds the settings themselves: no ['memfree'] in its messages."""
    settings = tmp_path / "memfree.json"
    settings.write_text(content, encoding="utf-8")
    with pytest.raises(ServingConfigError, match=f"^MEMFREE_CONFIG{message}") as error:
        ServingConfig.find({}, environ={"MEMFREE_CONFIG": str(settings)})
    assert "['memfree']" not in str(error.value)


@pytest.mark.parametrize("interval", [float("nan"), float("inf"), -1])
def test_a_log_interval_must_be_a_finite_number_of_seconds(interval: float) -> None:
    with pytest.raises(ServingConfigError, match=r"\['log_interval_s'\] must be a finite number"):
        ServingConfig.parse({"memfree": {"filter": "f", "log_interval_s": interval}})
    config = ServingConfig.parse({"memfree": {"filter": "f", "log_interval_s": 0}})
    assert config.log_interval_s == 0


def test_a_missing_filter_file_is_named_with_its_setting(
    tmp_path: Path, token_guarded: Any, helpers: Any, tokenizer_dir: Path
) -> None:
    missing = tmp_path / "no-such.memfree"
    config = helpers.vllm_config(tokenizer_dir, {"filter": str(missing)})
    with pytest.raises(FilterError) as error:
        MemFreeV1LogitsProcessor(config, torch.device("cpu"), False)
    assert str(error.value) == (
        f"additional_config['memfree']['filter'] ({missing}): the filter file does not exist; "
        "set additional_config['memfree']['filter'] to the path of an existing filter file "
        "(a relative path is read from the engine's working directory), or build one there with "
        "`memfree build`"
    )
    link = tmp_path / "link.memfree"
    link.symlink_to(missing)
    config = helpers.vllm_config(tokenizer_dir, {"filter": str(link)})
    with pytest.raises(FilterError, match=r"\(.*link\.memfree\): a symbolic link to .*no-such"):
        MemFreeV1LogitsProcessor(config, torch.device("cpu"), False)
