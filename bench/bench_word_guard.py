"""Benchmark: the word guard against the token guard, per step, with the default model on CPU.

Both filters hold the standard library's n-grams: 10-grams of the default tokenizer's ids, and
6-grams of normalized words (the eval's default word filter: about as much text, and about the
same share of held-out code blocked). Prompts are 50-token windows of standard-library code (the demo's), which
the model partly memorized. Prints the time spent inside each processor per step, the share of
generation time that is, and the word build's throughput.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

import torch

from eval.cli.evaluate import DEFAULT_WORD_FILTER, DEFAULT_WORD_N


class Timed:
    """Wraps a logits processor and adds up the time spent in it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        started = time.perf_counter()
        result = self.inner(input_ids, scores)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--token-filter", default="out/stdlib.memfree")
    parser.add_argument(
        "--word-filter",
        default=DEFAULT_WORD_FILTER,
        help=f"default: the eval's stdlib word filter ({DEFAULT_WORD_N}-grams), built if missing",
    )
    parser.add_argument(
        "--word-bloom-filter",
        default="out/stdlib-words-bloom.memfree",
        help="the same word n-grams in the Bloom layout (built if missing)",
    )
    parser.add_argument(
        "--false-bans",
        action="store_true",
        help="also count true and false bans per checked row on memorized contexts, against a "
        "near-exact reference (the same n-grams in a Bloom filter at fpr 1e-9)",
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()

    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree.cli.demo import stdlib_prompts
    from memfree.engines.transformers import MemFreeLogitsProcessor
    from memfree.models import load_model

    wanted = (
        (args.token_filter, "token", None),
        (args.word_filter, "word", None),
        (args.word_bloom_filter, "word", "blocked-512"),
    )
    if args.false_bans:
        exact_path = str(Path(args.word_filter).with_name("stdlib-words-exact.memfree"))
        wanted += ((exact_path, "word", "blocked-512"),)
    for path, unit, layout in wanted:
        if not Path(path).exists():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            summary = build_filter(
                ["stdlib:"],
                path,
                BuildSettings(
                    ngram_size=10 if unit == "token" else DEFAULT_WORD_N,
                    unit=unit,
                    workers=2,
                    layout=layout,
                    false_positive_rate=1e-9 if "exact" in path else None,
                ),
                progress=False,
            )
            print(
                f"built {path}: {summary.tokens:,} {unit}s in {summary.seconds:.1f} s "
                f"({summary.tokens_per_second:,.0f} {unit}s/s, 2 workers), "
                f"{summary.size_bytes / 2**20:.1f} MiB"
            )
    model, tokenizer = load_model()
    prompts = [ids for _, ids in stdlib_prompts(tokenizer, count=args.batch)]
    width = min(len(ids) for ids in prompts)
    batch = torch.tensor([ids[-width:] for ids in prompts])
    rows = []
    guards = (
        ("none", None),
        ("token", args.token_filter),
        ("word", args.word_filter),
        ("word-bloom", args.word_bloom_filter),
    )
    for name, path in guards:
        timed = Timed(MemFreeLogitsProcessor(path, tokenizer)) if path else None
        if timed is not None:
            name = f"{name} ({timed.inner.filter.layout})"
        if timed is not None:  # warm-up: per-vocabulary tables are built once per guard
            timed.inner.blocked_mask(batch, model.config.vocab_size)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=batch,
                attention_mask=torch.ones_like(batch),
                logits_processor=[timed] if timed else None,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=2,
            )
        total = time.perf_counter() - started
        steps = out.shape[1] - width
        inside = timed.seconds / max(timed.calls, 1) * 1000 if timed else 0.0
        share = timed.seconds / total if timed else 0.0
        checked = float(timed.inner.stats.checked.mean()) if timed else 0.0
        rows.append((name, total, inside, share, steps, checked))
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, CPU")
    print(
        f"batch {args.batch}, {args.new_tokens} new tokens, greedy; token 10-grams, word "
        f"{DEFAULT_WORD_N}-grams"
    )
    print(
        f"{'guard':30s} {'wall s':>8s} {'ms/step in guard':>17s} {'share':>7s} "
        f"{'rows checked':>13s} {'ms per checked row':>19s}"
    )
    for name, total, inside, share, _, checked in rows:
        per_row = inside / (checked * args.batch) if checked else 0.0
        print(
            f"{name:30s} {total:8.2f} {inside:17.2f} {share:7.1%} {checked:13.0%} {per_row:19.2f}"
        )
    token_ms, word_ms, bloom_ms = rows[1][2], rows[2][2], rows[3][2]
    print(f"word guard / token guard time per step: {word_ms / max(token_ms, 1e-9):.2f}x")
    print(f"word guard, Bloom / index time per step: {bloom_ms / max(word_ms, 1e-9):.2f}x")
    if args.false_bans:
        false_bans(tokenizer, model.config.vocab_size, args, exact_path)


def false_bans(tokenizer: Any, vocab_size: int, args: argparse.Namespace, exact: str) -> None:
    """True and false bans per checked row of the word guard in both layouts, on contexts cut
    every 4 tokens from the demo's memorized standard-library prompts."""
    from memfree.cli.demo import stdlib_prompts
    from memfree.engines.transformers import MemFreeLogitsProcessor

    contexts = [
        ids[:end] for _, ids in stdlib_prompts(tokenizer, count=40) for end in range(8, len(ids), 4)
    ]
    guards = {
        name: MemFreeLogitsProcessor(path, tokenizer)
        for name, path in (
            ("reference", exact),
            ("index", args.word_filter),
            ("bloom", args.word_bloom_filter),
        )
    }
    totals = {name: [0, 0] for name in guards}  # checked rows, bans past the reference's
    true_bans = 0
    for ids in contexts:
        row = torch.tensor([ids])
        masks = {name: guard.blocked_mask(row, vocab_size) for name, guard in guards.items()}
        reference = masks["reference"][0][0]
        true_bans += int(reference.sum())
        for name, (mask, checked) in masks.items():
            assert not bool((reference & ~mask[0]).any()), name  # no false negative
            totals[name][0] += int(checked[0])
            totals[name][1] += int((mask[0] & ~reference).sum())
    print(f"{len(contexts)} memorized contexts; bans per context (reference, fpr 1e-9 Bloom):")
    print(f"  true bans {true_bans / len(contexts):.2f} per context")
    for name in ("index", "bloom"):
        checked, false = totals[name]
        print(
            f"  {name:6s} ({guards[name].filter.layout}): rows checked {checked}, false bans "
            f"{false / max(checked, 1):.2f} per checked row"
        )


if __name__ == "__main__":
    main()
