"""Benchmark: what canonical decoding changes where nothing stored is at stake (issue 35).

The default model (SmolLM2-135M-Instruct) completes, greedily, windows of held-out standard-library
code and a few chat questions, unguarded and with the canonical guard over a filter that stores
nothing the model writes (one n-gram of ids it never emits). Where the unguarded output's ids are
already their text's tokenization, the guard should change nothing; the script prints how many
outputs it changed, and how many held a blank line before a column-0 line (what the rule "as if
the text ended there" banned).

    .venv/bin/python bench/bench_canonical_distortion.py [--prompts 30] [--new-tokens 48]

With ``--walk`` it runs no model: along the tokenizer's own tokenization of texts in many
scripts (random mixes, a fixed seed) it counts the steps where canonical decoding bans the
tokenizer's own next token (a character written with several tokens, a whitespace run). With
``--llama-cpp`` it does the same along llama.cpp's tokenizer test texts, for each of its test
vocabularies in ``<venv>/vocab/llama.cpp`` (``make setup``) that transformers reads, on the
texts where the tokenizer gives llama.cpp's own ids.
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
    "Translate 'good morning' into Chinese and Japanese.",
    "How do you say 'thank you' in Korean?",
    "Write a short greeting in Russian and in Chinese.",
    "Reply with three emoji that describe the sea.",
)
# Pieces of text the walks mix: scripts whose characters often have no token of their own.
PIECES = (
    "日本語のテキストです。", "中文注释", "艾晨", "싱가포르", "Привет мир", "ภาษาไทย",
    "ភាសាខ្មែរ", "हिन्दी", "العربية", "עברית", "😀", "🎉🎉", "👩\u200d💻", "🇫🇷", "𝐀𝐁", "𝟘𝟙",
    "\u3000", "“quoted” — ‘x’ … ™ ©", "naïve café", "a\u0301", "def f(x):\n", "    return x",
    " ", "  ", "\n\n", "The end.", "it's", "12", "(",
)  # fmt: skip


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


def walk(texts: int = 200, seed: int = 0) -> None:
    """The steps, along the tokenizer's own tokenization, whose next token is banned."""
    import random

    from memfree.core.canonical import CanonicalMasker
    from memfree.vocab.info import TokenizerInfo
    from memfree.vocab.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    info = TokenizerInfo.of(tokenizer)
    masker = CanonicalMasker(info, [info.eos_token_id])
    rng = random.Random(seed)
    steps = banned = partial = 0
    for _ in range(texts):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(2, 8)))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        counts = _banned_along(masker, info, ids)
        steps, partial, banned = steps + counts[0], partial + counts[1], banned + counts[2]
    print(
        f"walk: {texts} texts, {steps} steps ({partial} of them a token that is not whole "
        f"characters): the tokenizer's own next token banned at {banned}"
    )


def _banned_along(masker: object, info: object, ids: list[int]) -> tuple[int, int, int]:
    """(steps, of them a token that is not whole characters, of them banned)."""
    import torch

    steps = partial = banned = 0
    for end in range(len(ids)):
        row = torch.tensor([ids[:end] or [0]])[:, :end]
        mask, _ = masker.banned_mask(row, info.vocab_size)  # type: ignore[attr-defined]
        steps += 1
        try:
            (info.token_bytes[ids[end]] or b"").decode("utf-8")  # type: ignore[attr-defined]
        except UnicodeDecodeError:
            partial += 1
        banned += bool(mask[0, ids[end]])
    return steps, partial, banned


def llama_cpp() -> None:
    """The steps along llama.cpp's test texts whose next token is banned, per vocabulary."""
    import sys
    import time
    import warnings

    from transformers import AutoTokenizer

    from memfree.core.canonical import canonical_masker
    from memfree.vocab.bpe import CanonicalUnsupportedError
    from memfree.vocab.info import TokenizerInfo

    folder = Path(sys.prefix, "vocab", "llama.cpp")
    for path in sorted(folder.glob("ggml-vocab-*.gguf")):
        name = path.name[len("ggml-vocab-") : -len(".gguf")]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=path.name)
        texts = Path(f"{path}.inp").read_text().split("\n__ggml_vocab_test__\n")
        lines = Path(f"{path}.out").read_text().split("\n")
        pairs = [
            ids
            for text, line in zip(texts, lines, strict=False)
            if (ids := tokenizer(text, add_special_tokens=False)["input_ids"])
            == [int(i) for i in line.split()]
        ]
        info = TokenizerInfo.of(tokenizer)
        start = time.perf_counter()
        try:
            masker = canonical_masker(info, [info.eos_token_id])
        except CanonicalUnsupportedError:
            print(f"{name}: refused")
            continue
        built = time.perf_counter() - start
        totals = [0, 0, 0]
        for ids in pairs:
            for index, count in enumerate(_banned_along(masker, info, ids)):
                totals[index] += count
        steps, partial, banned = totals
        print(
            f"{name} ({_family(masker)}): {len(pairs)} of {len(texts)} "
            f"texts tokenized as llama.cpp does, {steps} steps ({partial} a token that is not "
            f"whole characters): the next token banned at {banned}; tables {built:.1f} s"
        )


def _family(masker: object) -> str:
    from memfree.core.canonical_spm import SentencePieceMasker

    if isinstance(masker, SentencePieceMasker):
        return f"SentencePiece-style BPE, '▁' put first: {masker.bpe.prepend}"
    return f"{masker.bpe.pattern or 'GPT-2'}'s pattern"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=30, help="code windows")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--walk", action="store_true", help="no model: the walks only")
    parser.add_argument("--llama-cpp", action="store_true", help="no model: llama.cpp's test texts")
    args = parser.parse_args()
    if args.walk:
        walk()
        return
    if args.llama_cpp:
        llama_cpp()
        return
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
