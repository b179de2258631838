"""The one vLLM class, as vLLM's loaders build it: through the ``vllm.logits_processors`` entry
point (read with importlib.metadata, as vLLM does), under V1's and Model Runner V2's
constructors, configured by ``additional_config`` or the environment, inert without a
configuration, refusing a wrong one, standing aside when built twice, and logging what it did."""

from __future__ import annotations

import json
import logging
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from memfree.engines.policy import ServingConfigError
from memfree.engines.vllm import (
    MemFreeV1LogitsProcessor,
    MemFreeV2LogitsProcessor,
    MemFreeVllmLogitsProcessor,
)
from memfree.engines.vllm_v1 import V1Guard
from memfree.engines.vllm_v2 import V2Guard
from memfree.errors import FilterError
from memfree.integrations import vllm as integration

LOGGER = "vllm.memfree"


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMFREE_FILTER", raising=False)
    monkeypatch.delenv("MEMFREE_CONFIG", raising=False)


def _config(helpers: Any, tokenizer_dir: Path, memfree: Any = None, **extra: Any) -> Any:
    config = helpers.vllm_config(tokenizer_dir, memfree)
    if memfree is None:
        config.additional_config = {}
    for key, value in extra.items():
        setattr(config, key, value)
    return config


def _v2_states(vocab: int) -> Any:
    return SimpleNamespace(device="cpu", max_num_reqs=4, vocab_size=vocab)


def _added(prompt: list[int]) -> Any:
    output: list[int] = []
    return SimpleNamespace(
        batch_size=1,
        removed=[],
        added=[(0, SimpleNamespace(extra_args=None), prompt, output)],
        moved=[],
    )


def test_the_entry_point_names_the_one_class() -> None:
    found = {ep.name: ep for ep in entry_points(group="vllm.logits_processors")}
    assert "memfree" in found, "reinstall the package (`make setup`) to register the entry point"
    assert found["memfree"].value == "memfree.integrations.vllm:MemFreeVllmLogitsProcessor"
    assert found["memfree"].load() is MemFreeVllmLogitsProcessor
    assert integration.MemFreeV1LogitsProcessor is integration.MemFreeV2LogitsProcessor
    assert MemFreeV1LogitsProcessor is MemFreeV2LogitsProcessor is MemFreeVllmLogitsProcessor
    # Its earlier name, which server flags may still give, names it too (not the transformers
    # processor of that name), though no longer exported.
    assert integration.MemFreeLogitsProcessor is MemFreeVllmLogitsProcessor
    assert "MemFreeLogitsProcessor" not in integration.__all__


def test_without_configuration_it_is_inert_and_says_so(
    helpers: Any, tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        v1 = MemFreeVllmLogitsProcessor(_config(helpers, tokenizer_dir), torch.device("cpu"), False)
        v2 = MemFreeVllmLogitsProcessor(_config(helpers, tokenizer_dir), _v2_states(50))
    assert caplog.text.count("installed but not configured") == 2
    assert v1.active is None and v2.active is None
    assert v1.is_argmax_invariant()  # V1 then calls it only where it samples
    v1.update_state(_added([1, 2, 3]))
    logits = torch.randn(1, 50)
    kept = logits.clone()
    assert v1.apply(logits) is logits and torch.equal(logits, kept)
    assert v2.add_request(0, SimpleNamespace(extra_args=None)) is False  # V2 never calls apply
    v2.apply_staged_writes()
    assert v2.apply(logits, SimpleNamespace()) is logits


def test_named_without_configuration_stops_the_engine(helpers: Any, tokenizer_dir: Path) -> None:
    config = _config(helpers, tokenizer_dir)
    config.model_config.logits_processors = ["memfree.integrations.vllm:MemFreeVllmLogitsProcessor"]
    with pytest.raises(ServingConfigError, match=r"has no configuration.*MEMFREE_FILTER"):
        MemFreeVllmLogitsProcessor(config, torch.device("cpu"), False)


@pytest.mark.parametrize(
    ("memfree", "message"),
    [
        ({"filter": 3}, r"\['filter'\] must be the path"),
        ({"filter": "f", "log_interval_s": -1}, "log_interval_s"),
        ("f.memfree", "must be a mapping"),
    ],
)
def test_a_present_but_wrong_configuration_stops_the_engine(
    helpers: Any, tokenizer_dir: Path, memfree: Any, message: str
) -> None:
    with pytest.raises(ServingConfigError, match=message):
        MemFreeVllmLogitsProcessor(
            _config(helpers, tokenizer_dir, memfree), torch.device("cpu"), False
        )


def test_the_environment_configures_it(
    helpers: Any,
    tokenizer_dir: Path,
    token_guarded: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = str(token_guarded.filter.path)
    prompt = token_guarded.corpus_ids[0][:12]
    logits = torch.randn(1, token_guarded.width)
    explicit = MemFreeVllmLogitsProcessor(
        _config(helpers, tokenizer_dir, {"filter": path}), torch.device("cpu"), False
    )
    explicit.update_state(_added(prompt))
    expected = explicit.apply(logits.clone())
    assert torch.isneginf(expected).any()
    settings = tmp_path / "memfree.json"
    settings.write_text(json.dumps({"filter": path, "allow_opt_out": True}), encoding="utf-8")
    for name, value in (("MEMFREE_FILTER", path), ("MEMFREE_CONFIG", str(settings))):
        monkeypatch.setenv(name, value)
        processor = MemFreeVllmLogitsProcessor(
            _config(helpers, tokenizer_dir), torch.device("cpu"), False
        )
        assert isinstance(processor.active, V1Guard)
        processor.update_state(_added(prompt))
        assert torch.equal(processor.apply(logits.clone()), expected)
        monkeypatch.delenv(name)
    assert (
        processor.active.config.allow_opt_out and "MEMFREE_CONFIG" in processor.active.config.source
    )
    # Under Model Runner V2's constructor the same configuration builds the V2 implementation.
    monkeypatch.setenv("MEMFREE_FILTER", path)
    v2 = MemFreeVllmLogitsProcessor(
        _config(helpers, tokenizer_dir), _v2_states(token_guarded.width)
    )
    assert isinstance(v2.active, V2Guard)


def test_bad_environments_are_refused_by_name(
    helpers: Any, tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = lambda: MemFreeVllmLogitsProcessor(  # noqa: E731
        _config(helpers, tokenizer_dir), torch.device("cpu"), False
    )
    monkeypatch.setenv("MEMFREE_CONFIG", str(tmp_path / "missing.json"))
    with pytest.raises(ServingConfigError, match=r"MEMFREE_CONFIG=.*missing\.json: cannot read"):
        build()
    (tmp_path / "bad.json").write_text("{filter: x}", encoding="utf-8")
    monkeypatch.setenv("MEMFREE_CONFIG", str(tmp_path / "bad.json"))
    with pytest.raises(ServingConfigError, match="as a JSON file"):
        build()
    (tmp_path / "odd.json").write_text('{"filter": "f", "allow_opt_out": "yes"}', encoding="utf-8")
    monkeypatch.setenv("MEMFREE_CONFIG", str(tmp_path / "odd.json"))
    with pytest.raises(ServingConfigError, match="allow_opt_out"):
        build()
    monkeypatch.setenv("MEMFREE_FILTER", "f.memfree")
    with pytest.raises(ServingConfigError, match="both MEMFREE_CONFIG and MEMFREE_FILTER"):
        build()
    monkeypatch.delenv("MEMFREE_CONFIG")
    with pytest.raises(
        FilterError,
        match=r"^MEMFREE_FILTER=f\.memfree: the filter file does not exist \(looked for /.*; set "
        r"MEMFREE_FILTER to the path of an existing filter file.*`memfree build`$",
    ):
        build()  # the filter file does not exist


def test_built_twice_for_one_engine_the_second_stands_aside(
    helpers: Any, tokenizer_dir: Path, token_guarded: Any, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(helpers, tokenizer_dir, {"filter": str(token_guarded.filter.path)})
    first = MemFreeVllmLogitsProcessor(config, torch.device("cpu"), False)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        second = MemFreeVllmLogitsProcessor(config, torch.device("cpu"), False)
    assert first.active is not None and second.active is None
    assert "stands aside" in caplog.text
    other = _config(helpers, tokenizer_dir, {"filter": str(token_guarded.filter.path)})
    assert MemFreeVllmLogitsProcessor(other, torch.device("cpu"), False).active is not None


def test_v1_async_scheduling_needs_the_class_named(
    helpers: Any, tokenizer_dir: Path, token_guarded: Any
) -> None:
    memfree = {"filter": str(token_guarded.filter.path)}
    scheduler = SimpleNamespace(async_scheduling=True)
    config = _config(helpers, tokenizer_dir, memfree, scheduler_config=scheduler)
    with pytest.raises(ServingConfigError, match=r"async scheduling.*--logits-processors"):
        MemFreeVllmLogitsProcessor(config, torch.device("cpu"), False)
    named = _config(helpers, tokenizer_dir, memfree, scheduler_config=scheduler)
    named.model_config.logits_processors = [MemFreeVllmLogitsProcessor]
    assert MemFreeVllmLogitsProcessor(named, torch.device("cpu"), False).active is not None
    # Model Runner V2 reads the committed ids from its own state: no such limit.
    v2 = _config(helpers, tokenizer_dir, memfree, scheduler_config=scheduler)
    assert MemFreeVllmLogitsProcessor(v2, _v2_states(token_guarded.width)).active is not None


def test_the_log_line_counts_what_the_guard_did(
    helpers: Any, tokenizer_dir: Path, token_guarded: Any, caplog: pytest.LogCaptureFixture
) -> None:
    memfree = {"filter": str(token_guarded.filter.path), "log_interval_s": 3600}
    processor = MemFreeVllmLogitsProcessor(
        _config(helpers, tokenizer_dir, memfree), torch.device("cpu"), False
    )
    ids = token_guarded.corpus_ids[0]
    prompt = ids[: helpers.N + 2]
    processor.update_state(_added(prompt))
    removed = 0
    for step in range(3):
        logits = torch.zeros(1, token_guarded.width)
        follow = ids[len(prompt) + step] if step < 2 else 0
        logits[0, follow] = 10.0  # the first choice copies the corpus at the first two steps
        out = processor.apply(logits)
        removed += bool(torch.isneginf(out[0, follow]))
        processor.active.requests[0].output.append(int(out[0].argmax()))
    assert removed >= 1
    assert processor.log is not None
    with caplog.at_level(logging.INFO, logger=LOGGER):
        line = processor.log.flush()
    assert "1 requests guarded (0 opted out), 3 steps, 3 rows," in line
    assert f"{removed} first choices removed" in line and line in caplog.text
    assert np.isclose(processor.log.interval, 3600)


@pytest.mark.parametrize(
    ("memfree", "environ", "message"),
    [
        (None, {"MEMFREE_FILTER": ""}, "MEMFREE_FILTER is set but empty"),
        (None, {"MEMFREE_CONFIG": ""}, "MEMFREE_CONFIG is set but empty"),
        ({}, {}, r"additional_config\['memfree'\] is empty"),
    ],
)
def test_a_present_but_empty_configuration_stops_the_engine(
    helpers: Any,
    tokenizer_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    memfree: Any,
    environ: dict[str, str],
    message: str,
) -> None:
    """Not "not configured" (inert, one info line): the engine does not start unguarded."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = _config(helpers, tokenizer_dir, memfree)
    with pytest.raises(ServingConfigError, match=message):
        MemFreeVllmLogitsProcessor(config, torch.device("cpu"), False)
    with pytest.raises(ServingConfigError, match=message):
        MemFreeVllmLogitsProcessor(config, _v2_states(50))


def test_a_null_configuration_stops_the_engine(helpers: Any, tokenizer_dir: Path) -> None:
    config = _config(helpers, tokenizer_dir)
    config.additional_config = {"memfree": None}
    with pytest.raises(ServingConfigError, match=r"additional_config\['memfree'\] is null"):
        MemFreeVllmLogitsProcessor(config, torch.device("cpu"), False)
