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
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()

    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree.cli.demo import stdlib_prompts
    from memfree.engines.transformers import MemFreeLogitsProcessor
    from memfree.models import load_model

    for path, unit in ((args.token_filter, "token"), (args.word_filter, "word")):
        if not Path(path).exists():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            summary = build_filter(
                ["stdlib:"],
                path,
                BuildSettings(
                    ngram_size=10 if unit == "token" else DEFAULT_WORD_N, unit=unit, workers=2
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
    for name, path in (("none", None), ("token", args.token_filter), ("word", args.word_filter)):
        timed = Timed(MemFreeLogitsProcessor(path, tokenizer)) if path else None
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
        f"{'guard':6s} {'wall s':>8s} {'ms/step in guard':>17s} {'share':>7s} "
        f"{'rows checked':>13s} {'ms per checked row':>19s}"
    )
    for name, total, inside, share, _, checked in rows:
        per_row = inside / (checked * args.batch) if checked else 0.0
        print(f"{name:6s} {total:8.2f} {inside:17.2f} {share:7.1%} {checked:13.0%} {per_row:19.2f}")
    token_ms, word_ms = rows[1][2], rows[2][2]
    print(f"word guard / token guard time per step: {word_ms / max(token_ms, 1e-9):.2f}x")


if __name__ == "__main__":
    main()
