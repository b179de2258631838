"""The guard inside a real transformers architecture (tiny Llama, real tokenizer, KV cache):
batches with left padding, beams, several return sequences, a TextStreamer, a pipeline, and the
``memfree generate`` command."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from memfree import MemFreeLogitsProcessor, NgramFilter
from memfree.cli import main as cli_main
from memfree.cli.common import explain
from memfree.generation import (
    Completion,
    DecodingSettings,
    Intervention,
    complete,
)
from memfree.units import stored_ngram_counts
from memfree.vocab.tokenizer import tokenizer_fingerprint

PROMPTS = ["def add(a, b):", "class Stack:\n    def", "import os\nimport sys\n", "for i in"]
N = 4


def own_output_filter(
    path: Path, model: Any, tokenizer: Any, settings: DecodingSettings
) -> tuple[NgramFilter, list[Completion]]:
    """A filter of every n-gram the unguarded model emits: its output is "memorized" by
    construction, so the guard must change every completion."""
    plain = complete(model, tokenizer, PROMPTS, settings)
    ngrams = []
    for completion in plain:
        sequence = completion.prompt_ids + completion.output_ids
        ngrams += [sequence[i : i + N] for i in range(len(sequence) - N + 1)]
    filt = NgramFilter.from_ngrams(
        path,
        np.array(ngrams),
        false_positive_rate=1e-6,
        metadata={"tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)},
    )
    for completion in plain:
        completion.stored_ngrams = stored_ngram_counts(
            filt, completion.prompt_ids, completion.output_ids
        )[0]
    return filt, plain


@pytest.mark.parametrize(
    "settings",
    [
        DecodingSettings(max_new_tokens=12, batch_size=4),
        DecodingSettings(max_new_tokens=12, batch_size=1),
        DecodingSettings(max_new_tokens=12, do_sample=True, top_k=5, seed=1),
        DecodingSettings(max_new_tokens=12, do_sample=True, top_p=0.8, num_return_sequences=3),
        DecodingSettings(max_new_tokens=12, num_beams=3, num_return_sequences=2),
    ],
    ids=["greedy-batch", "greedy-one-by-one", "top-k", "top-p-several", "beam"],
)
def test_guarded_llama_emits_no_stored_ngram(
    tmp_path: Path, tiny_llama: Any, tokenizer: Any, settings: DecodingSettings
) -> None:
    filt, plain = own_output_filter(tmp_path / "f.memfree", tiny_llama, tokenizer, settings)
    assert all(completion.stored_ngrams for completion in plain if len(completion.output_ids) > 1)
    guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, ngram_size=N)
    guarded = complete(tiny_llama, tokenizer, PROMPTS, settings, guard)
    assert len(guarded) == len(PROMPTS) * settings.num_return_sequences
    for completion in guarded:
        assert completion.stored_ngrams == 0, completion
    assert guard.stats.summary()["tokens_blocked"] > 0
    if settings.num_beams == 1 and not settings.do_sample:
        assert all(completion.interventions for completion in guarded)


def test_left_padding_does_not_leak_into_windows(
    tmp_path: Path, tiny_llama: Any, tokenizer: Any
) -> None:
    # Every 4-gram that starts with the pad token is stored: padding must never complete one.
    pad = tokenizer.pad_token_id
    stored = [[pad, pad, pad, token] for token in range(len(tokenizer))]
    filt = NgramFilter.from_ngrams(tmp_path / "f.memfree", np.array(stored))
    guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, canonical=False)  # random ids
    mask, checked = guard.blocked_mask(torch.tensor([[pad, pad, pad], [5, 6, 7]]), len(tokenizer))
    assert not mask.any() and not checked[0]


def test_text_streamer_and_pipeline(
    tmp_path: Path, tiny_llama: Any, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import LogitsProcessorList, TextStreamer, pipeline

    settings = DecodingSettings(max_new_tokens=10, batch_size=1)
    filt, _ = own_output_filter(tmp_path / "f.memfree", tiny_llama, tokenizer, settings)
    guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
    ids = tokenizer(PROMPTS[0], add_special_tokens=False, return_tensors="pt")
    out = tiny_llama.generate(
        **ids,
        logits_processor=[guard],
        streamer=TextStreamer(tokenizer),
        max_new_tokens=10,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    streamed = capsys.readouterr().out
    new = out[0, ids["input_ids"].shape[1] :].tolist()
    assert tokenizer.decode(new).strip() in streamed
    assert stored_ngram_counts(filt, ids["input_ids"][0].tolist(), new)[0] == 0

    generator = pipeline("text-generation", model=tiny_llama, tokenizer=tokenizer, device="cpu")
    result = generator(
        PROMPTS[0],
        logits_processor=LogitsProcessorList([guard]),
        max_new_tokens=10,
        do_sample=False,
        return_full_text=False,
    )
    # The pipeline ran the same guarded generation as the direct call above (no stored n-gram).
    assert result[0]["generated_text"] == tokenizer.decode(new, skip_special_tokens=True)
    assert guard.stats.num_steps > 0


def test_explain_notation(tokenizer: Any) -> None:
    ids = tokenizer("return a + b", add_special_tokens=False)["input_ids"]
    other = tokenizer("-", add_special_tokens=False)["input_ids"][0]
    completion = Completion(
        "p", [], ids, tokenizer.decode(ids), True, [Intervention(2, other, ids[2])]
    )
    chosen = tokenizer.decode([ids[2]])
    assert explain(tokenizer, completion) == (
        f"{tokenizer.decode(ids[:2])}[[- -> {chosen}]]{tokenizer.decode(ids[3:])}"
    )
    coloured = explain(tokenizer, completion, color=True)
    assert f"\033[9;31m-\033[0m\033[32m{chosen}\033[0m" in coloured


def test_decoding_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="top_p must be in"):
        DecodingSettings(top_p=1.5)
    with pytest.raises(ValueError, match="must not exceed num_beams"):
        DecodingSettings(num_return_sequences=2)
    assert DecodingSettings(do_sample=True, top_k=3).generate_kwargs()["top_k"] == 3


@pytest.fixture
def saved_llama(tmp_path: Path, tiny_llama: Any, tokenizer: Any) -> Path:
    directory = tmp_path / "tiny-llama"
    tiny_llama.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_cli_generate_compare_explain_json(
    tmp_path: Path,
    saved_llama: Path,
    tiny_llama: Any,
    tokenizer: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = DecodingSettings(max_new_tokens=12, batch_size=1)
    own_output_filter(tmp_path / "f.memfree", tiny_llama, tokenizer, settings)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS) + "\n")
    common = ["generate", "--filter", str(tmp_path / "f.memfree"), "--model", str(saved_llama)]
    assert (
        cli_main(
            [
                *common,
                "--prompts",
                str(prompts),
                "--compare",
                "--json",
                "--max-new-tokens",
                "12",
                "--batch-size",
                "1",
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [record["prompt"] for record in records] == PROMPTS
    for record in records:
        assert record["guarded_stored_ngrams"] == 0
        assert record["unguarded_stored_ngrams"] > 0
        # The same count in the text tokenized again (the guard promises nothing there).
        assert record["guarded_stored_text_ngrams"] == 0  # canonical decoding: over the text
        for side in ("guarded", "unguarded"):
            prompt_ids = tokenizer(record["prompt"], add_special_tokens=False)["input_ids"]
            output_ids = tokenizer(record[side], add_special_tokens=False)["input_ids"]
            expected = stored_ngram_counts(
                NgramFilter.open(tmp_path / "f.memfree"),
                prompt_ids,
                output_ids,
                tokenizer=tokenizer,
                text=True,
            )[0]
            assert record[f"{side}_stored_text_ngrams"] == expected
        assert record["interventions"]
    assert (
        cli_main(
            [
                *common,
                "--prompt",
                PROMPTS[0],
                "--compare",
                "--explain",
                "--max-new-tokens",
                "12",
                "--color",
                "never",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "unguarded:" in text and "guarded: 0 stored 4-grams" in text and " -> " in text
    assert re.search(r"in their text tokenized again: guarded 0, unguarded \d+", text)
    assert "promise: no stored token n-gram in the ids, nor in their text" in text
    arguments = [*common, "--prompt", PROMPTS[0], "--max-new-tokens", "12", "--no-canonical"]
    assert cli_main(arguments) == 0
    text = capsys.readouterr().out
    assert "promise: no stored token n-gram in the ids (not their text" in text


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--filter", "missing.memfree", "--prompt", "x"], "no such filter file"),
        (["--prompt", "x", "--top-p", "2"], "--top-p must be in"),
        (["--prompt", "x", "--explain", "--num-beams", "2"], "cannot follow beams"),
        (["--prompts", "nowhere.txt"], "no such prompts file"),
        (["--prompt", "x", "--model", "/nonexistent/model"], "memfree never downloads"),
        (["--prompt", "  "], "prompt 1 is empty"),
        (["--prompt", "x", "--device", "nonsense"], "not a torch device"),
    ],
)
def test_cli_generate_refuses_bad_input(
    tmp_path: Path,
    arguments: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    NgramFilter.from_ngrams(tmp_path / "f.memfree", np.array([[1, 2, 3]]))
    if "--filter" not in arguments:
        arguments = ["--filter", "f.memfree", *arguments]
    assert cli_main(["generate", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_cli_generate_refuses_a_filter_of_another_tokenizer(
    tmp_path: Path, saved_llama: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    NgramFilter.from_ngrams(
        tmp_path / "f.memfree",
        np.array([[1, 2, 3]]),
        metadata={"tokenizer_fingerprint": "feedfacefeedface", "tokenizer": "other"},
    )
    code = cli_main(
        [
            "generate",
            "--filter",
            str(tmp_path / "f.memfree"),
            "--model",
            str(saved_llama),
            "--prompt",
            "x",
        ]
    )
    assert code == 2
    assert "Rebuild the filter" in capsys.readouterr().err


def test_cli_generate_refuses_an_empty_filter_unless_allowed(
    tmp_path: Path, saved_llama: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A filter of no n-gram guards nothing: refused (before the model loads) with the fix and
    the opt-in in the command's own terms; ``--allow-empty`` runs it."""
    path = tmp_path / "empty.memfree"
    fingerprint = tokenizer_fingerprint(tokenizer)
    NgramFilter.from_ngrams(
        path, np.zeros((0, 3), np.int64), metadata={"tokenizer_fingerprint": fingerprint}
    )
    common = ["generate", "--filter", str(path), "--model", str(saved_llama), "--prompt", "x"]
    assert cli_main([*common, "--max-new-tokens", "2"]) == 2
    error = capsys.readouterr().err
    assert "stores no n-gram" in error and "pass --allow-empty" in error
    assert "allow_empty=True" not in error
    assert cli_main([*common, "--max-new-tokens", "2", "--allow-empty"]) == 0


def short_context_llama(tokenizer: Any, context: int) -> Any:
    """A tiny Llama (random weights) whose context is ``context`` positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config).eval()


LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 6


def test_a_prompt_longer_than_the_context_is_cut_from_the_left(tokenizer: Any) -> None:
    model = short_context_llama(tokenizer, context=32)
    ids = tokenizer(LONG_PROMPT, add_special_tokens=False)["input_ids"]
    assert len(ids) > 32
    settings = DecodingSettings(max_new_tokens=8, batch_size=2)
    with pytest.warns(UserWarning) as caught:
        cut, short = complete(model, tokenizer, [LONG_PROMPT, "def add(a, b):"], settings)
    assert [str(w.message) for w in caught] == [
        f"a prompt of {len(ids)} tokens does not fit in the model's context of 32 tokens with "
        f"8 new tokens: its first {len(ids) - 24} tokens were cut (the model sees its last 24)"
    ]
    assert cut.prompt == LONG_PROMPT and cut.prompt_ids == ids[-24:]
    assert short.prompt_ids == tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a prompt that fits, to the last position: no warning
        (direct,) = complete(model, tokenizer, [ids[-24:]], settings)
    assert cut.output_ids == direct.output_ids
    with pytest.raises(ValueError, match="max_new_tokens 32 leaves no room for a prompt"):
        complete(model, tokenizer, ["x"], replace(settings, max_new_tokens=32))


def test_cli_generate_warns_about_a_cut_prompt_and_refuses_too_many_new_tokens(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    model = short_context_llama(tokenizer, context=32)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    NgramFilter.from_ngrams(
        tmp_path / "f.memfree",
        np.array([[1, 2, 3]]),
        metadata={"tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)},
    )
    common = [
        "generate",
        "--filter",
        str(tmp_path / "f.memfree"),
        "--model",
        str(tmp_path / "model"),
    ]
    length = len(tokenizer(LONG_PROMPT, add_special_tokens=False)["input_ids"])
    assert cli_main([*common, "--prompt", LONG_PROMPT, "--max-new-tokens", "8", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["prompt"] == LONG_PROMPT
    assert (
        f"memfree: warning: a prompt of {length} tokens does not fit in the model's context of 32 "
        f"tokens with 8 new tokens: its first {length - 24} tokens were cut" in captured.err
    )
    assert cli_main([*common, "--prompt", "x", "--max-new-tokens", "40"]) == 2
    assert capsys.readouterr().err == (
        "memfree: error: --max-new-tokens 40 leaves no room for a prompt in the model's context "
        "of 32 tokens; give at most 31\n"
    )


def test_cli_generate_help_states_the_context_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "cut from the left" in text and "with a warning" in text


@pytest.mark.parametrize("kind", ["directory", "loop"])
def test_cli_generate_says_what_an_unreadable_prompts_file_is(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    NgramFilter.from_ngrams(tmp_path / "f.memfree", np.array([[1, 2, 3]]))
    prompts = tmp_path / "prompts.txt"
    if kind == "directory":
        prompts.mkdir()
    else:
        prompts.symlink_to("prompts.txt")
    code = cli_main(
        ["generate", "--filter", str(tmp_path / "f.memfree"), "--prompts", str(prompts)]
    )
    assert code == 2
    expected = "is a directory" if kind == "directory" else "is a symbolic link loop"
    assert capsys.readouterr().err == f"memfree: error: {prompts}: {expected}\n"


def test_complete_counts_only_when_asked(tmp_path: Path, tiny_llama: Any, tokenizer: Any) -> None:
    settings = DecodingSettings(max_new_tokens=6, batch_size=2)
    filt, _ = own_output_filter(tmp_path / "f.memfree", tiny_llama, tokenizer, settings)
    guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
    counted = complete(tiny_llama, tokenizer, PROMPTS[:2], settings, guard)
    silent = complete(tiny_llama, tokenizer, PROMPTS[:2], settings, guard, count_stored=False)
    assert all(c.stored_ngrams is not None for c in counted)
    assert all(c.stored_ngrams is None and c.stored_text_ngrams is None for c in silent)
    assert [c.output_ids for c in silent] == [c.output_ids for c in counted]
