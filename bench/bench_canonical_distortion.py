"""Benchmark: what canonical decoding changes where nothing stored is at stake (issue 35).

The default model (SmolLM2-135M-Instruct) completes, greedily, windows of held-out standard-library
code and a few chat questions, unguarded and with the canonical guard over a filter that stores
nothing the model writes (one n-gram of ids it never emits). Where the unguarded output's ids are
already their text's tokenization, the guard should change nothing; the script prints how many
outputs it changed, and how many held a blank line before a column-0 line (what the rule "as if
the text ended there" banned).

    .venv/bin/python bench/bench_canonical_distortion.py [--prompts 30] [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from memfree import MemFreeLogitsProcessor
from memfree.generation import DecodingSettings, complete
from memfree.models import load_model
from memfree.testing import token_filter_from_ngrams

MODULES = ("textwrap", "shlex", "netrc", "fnmatch", "glob", "colorsys", "bisect", "sched")
CHATS = (
    "Give me a numbered list of three fruits.",
    "Write a Python function that reverses a string, with an example.",
    "Explain in two short paragraphs what a hash table is.",
    "Write a haiku about autumn, then explain it.",
)


def _code_prompts(tokenizer: object, count: int, width: int = 50) -> list[list[int]]:
    import importlib

    prompts: list[list[int]] = []
    per_module = max(1, count // len(MODULES) + 1)
    for name in MODULES:
        text = Path(importlib.import_module(name).__file__ or "").read_text()
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        step = max(width, (len(ids) - width) // per_module)
        for start in range(0, len(ids) - width, step)[:per_module]:
            # a prompt given as text: the window's text, tokenized again
            window = tokenizer.decode(ids[start : start + width])  # type: ignore[attr-defined]
            prompts.append(tokenizer(window, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
    return prompts[:count]


def _blank_lines(text: str) -> int:
    return sum(
        1 for i in range(len(text) - 2) if text[i : i + 2] == "\n\n" and not text[i + 2].isspace()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=30, help="code windows")
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    model, tokenizer = load_model()
    with tempfile.TemporaryDirectory() as directory:
        nothing = token_filter_from_ngrams(
            Path(directory) / "nothing.memfree", [[49000, 49001, 49002, 49003]], tokenizer
        )
        chats = [
            tokenizer(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
                ),
                add_special_tokens=False,
            )["input_ids"]
            for q in CHATS
        ]
        settings = DecodingSettings(max_new_tokens=args.new_tokens)
        for label, prompts in (("code", _code_prompts(tokenizer, args.prompts)), ("chat", chats)):
            plain = complete(model, tokenizer, prompts, settings)
            guard = MemFreeLogitsProcessor(nothing, tokenizer=tokenizer)
            guarded = complete(model, tokenizer, prompts, settings, guard)
            canonical = changed = blank = 0
            for prompt, a, b in zip(prompts, plain, guarded, strict=True):
                row = prompt + a.output_ids
                if tokenizer(tokenizer.decode(row), add_special_tokens=False)["input_ids"] != row:
                    continue
                canonical += 1
                changed += a.output_ids != b.output_ids
                blank += _blank_lines(a.text)
            print(
                f"{label}: {len(prompts)} prompts, {canonical} unguarded outputs already "
                f"canonical, {changed} of them changed by canonical decoding; {blank} blank "
                f"lines before a column-0 line in them"
            )


if __name__ == "__main__":
    main()
