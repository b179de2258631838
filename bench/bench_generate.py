"""Benchmark: guarded vs unguarded generation with the default model on this machine's CPU, the
cost of one step's full-vocabulary mask, and how often the exact fast path (prefix skip) applies.

Both layouts of the stdlib filter are measured in one run: the blocked Bloom filter
(``--filter``) and the prefix-keyed index (``--index``), each guard over the ids alone
(``canonical=False``: the n-gram side) and with canonical decoding (the default).

Prompts: 50-token windows of standard-library code (the demo's), which the model partly memorized:
the hardest case for the fast path, since memorized text keeps hitting stored prefixes.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def timed_generate(
    model: Any, batch: torch.Tensor, processors: Any, new_tokens: int, **kw: Any
) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            input_ids=batch,
            attention_mask=torch.ones_like(batch),
            logits_processor=processors,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=2,
            **kw,
        )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--filter", default="out/stdlib-bloom.memfree")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--index", default="out/stdlib-index.memfree")
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree import MemFreeLogitsProcessor, NgramFilter
    from memfree.cli.demo import stdlib_prompts
    from memfree.models import load_model

    model, tokenizer = load_model(device=args.device)
    if not Path(args.filter).exists():
        settings = BuildSettings(layout="blocked-512")
        build_filter(["stdlib:"], args.filter, settings, tokenizer=tokenizer)
    if not Path(args.index).exists():
        build_filter(
            ["stdlib:"], args.index, BuildSettings(layout="prefix-index"), tokenizer=tokenizer
        )
    filt = NgramFilter.open(args.filter)
    index = NgramFilter.open(args.index)
    guards = {
        "bloom, ids only": MemFreeLogitsProcessor(filt, tokenizer=tokenizer, canonical=False),
        "index, ids only": MemFreeLogitsProcessor(index, tokenizer=tokenizer, canonical=False),
        "bloom, canonical": MemFreeLogitsProcessor(filt, tokenizer=tokenizer),
        "index, canonical": MemFreeLogitsProcessor(index, tokenizer=tokenizer),
    }
    prompts = [ids for _, ids in stdlib_prompts(tokenizer, 8)]
    device = torch.device(args.device)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), device {device}"
    )
    print(
        f"model SmolLM2-135M-Instruct, filter {filt.num_ngrams:,} stored {filt.n}-grams "
        f"({filt.size_bytes / 2**20:.1f} MiB), {args.new_tokens} new tokens"
    )

    configurations = [
        ("greedy, batch 1", 1, {"do_sample": False}),
        ("greedy, batch 8", 8, {"do_sample": False}),
        (
            "sampling (T=0.8, top-p 0.95), batch 8",
            8,
            {"do_sample": True, "temperature": 0.8, "top_p": 0.95},
        ),
    ]
    inside = [0.0]

    class Timed:
        """The guard, with the time spent inside it accumulated (what the wall ratio estimates
        with a lot of noise on a shared 2-core machine)."""

        def __init__(self, guard: Any) -> None:
            self.guard = guard

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            started = time.perf_counter()
            result = self.guard(input_ids, scores)
            if device.type == "cuda":
                torch.cuda.synchronize()
            inside[0] += time.perf_counter() - started
            return result

    print(
        f"\n{'configuration':58s} {'unguarded':>10s} {'guarded':>10s} {'ratio':>7s} "
        f"{'in guard':>9s} {'per step':>9s} {'skipped':>8s}"
    )
    for (name, batch_size, kwargs), (label, guard) in (
        (configuration, guard) for configuration in configurations for guard in guards.items()
    ):
        count = 4 if batch_size == 1 else 1
        batches = [
            torch.tensor(prompts[i * batch_size : (i + 1) * batch_size], device=device)
            for i in range(count)
        ]
        timed_generate(model, batches[0], None, 4, **kwargs)  # warm up
        plain, guarded, shares, skipped = [], [], [], []
        for _ in range(args.repeats):
            torch.manual_seed(0)
            plain.append(
                sum(timed_generate(model, b, None, args.new_tokens, **kwargs) for b in batches)
            )
            torch.manual_seed(0)
            inside[0] = 0.0
            seconds = 0.0
            for b in batches:
                seconds += timed_generate(model, b, [Timed(guard)], args.new_tokens, **kwargs)
                skipped.append(guard.stats.summary()["fraction_skipped"])
            guarded.append(seconds)
            shares.append(inside[0])
        ratio = min(guarded) / min(plain)
        step_ms = min(shares) / (args.new_tokens * count) * 1e3
        print(
            f"{name + ' - ' + label:58s} {min(plain):9.2f}s {min(guarded):9.2f}s {ratio:6.3f}x "
            f"{min(shares) / min(guarded):8.1%} {step_ms:7.2f}ms {np.mean(skipped):7.0%}"
        )

    print("\none step's mask (Bloom layout), vocabulary of", len(tokenizer), "tokens (best of 20):")
    stored_window = torch.tensor([prompts[0][:9]], device=device)
    assert bool(filt.contains_prefixes(np.array([prompts[0][:9]]))[0])
    rng = np.random.default_rng(0)
    candidates = rng.integers(17, len(tokenizer), size=(100, filt.n - 1))
    novel_np = candidates[~filt.contains_prefixes(candidates)][:1]
    novel = torch.tensor(novel_np, device=device)
    dense = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, skip_rows=False, record_stats=False)
    sparse = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, record_stats=False)
    vocab = len(tokenizer)
    cases = [
        ("dense, every probe, 1 row", dense, stored_window),
        ("sparse (CPU), prefix stored, 1 row", sparse, stored_window),
        ("sparse (CPU), prefix not stored, 1 row", sparse, novel),
        ("dense, every probe, 8 rows", dense, stored_window.repeat(8, 1)),
        ("sparse (CPU), prefix stored, 8 rows", sparse, stored_window.repeat(8, 1)),
    ]
    for label, processor, ids in cases:
        processor.blocked_mask(ids, vocab)
        times = []
        for _ in range(20):
            started = time.perf_counter()
            processor.blocked_mask(ids, vocab)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        print(f"  {label:42s} {min(times) * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
