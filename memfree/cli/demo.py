"""``make demo`` (``python -m memfree.cli.demo``): the main job on the embedded defaults.

Builds a filter of this Python's standard library with SmolLM2-135M-Instruct's tokenizer, then
completes real stdlib code prompts with and without the guard and shows, side by side, how much
of each completion is stored stdlib code (stored 10-grams). Undefended, the model copies stdlib
code verbatim; guarded, no completion holds a stored 10-gram.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np


def stdlib_prompts(
    tokenizer: Any, count: int, prompt_tokens: int = 50, seed: int = 0, room: int = 64
) -> list[tuple[str, list[int]]]:
    """``count`` prompts of ``prompt_tokens`` tokens cut from random stdlib modules (tests
    excluded), each with at least ``room`` more tokens of the module after it.

    Returns:
        (module path relative to the stdlib, prompt token ids) pairs.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(
            d
            for d in subdirectories
            if d not in ("test", "tests", "site-packages", "idle_test", "__pycache__")
        )
        files += [Path(directory) / name for name in sorted(names) if name.endswith(".py")]
    rng = np.random.default_rng(seed)
    prompts: list[tuple[str, list[int]]] = []
    for index in rng.permutation(len(files)):
        try:
            text = files[index].read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < prompt_tokens + room:
            continue
        start = int(rng.integers(0, len(ids) - prompt_tokens - room + 1))
        prompts.append((str(files[index].relative_to(root)), ids[start : start + prompt_tokens]))
        if len(prompts) == count:
            break
    return prompts


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns 0 when no guarded completion holds a stored 10-gram, else 1."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=20, help="stdlib prompts to complete")
    parser.add_argument("--show", type=int, default=3, help="completions to print side by side")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--output", default="out/stdlib.memfree", help="filter file (reused)")
    args = parser.parse_args(argv)

    from memfree.cli.common import disable_download_bars

    disable_download_bars()
    from memfree import MemFreeLogitsProcessor
    from memfree.generation import DecodingSettings, complete

    model, tokenizer, filt = _model_and_filter(Path(args.output))
    guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
    prompts = stdlib_prompts(tokenizer, args.prompts)
    settings = DecodingSettings(max_new_tokens=args.max_new_tokens, batch_size=10)
    print(
        f"\ncompleting {len(prompts)} stdlib prompts of 50 tokens, greedy, "
        f"{settings.max_new_tokens} new tokens, with and without the guard ...",
        flush=True,
    )
    ids = [prompt for _, prompt in prompts]
    started = time.perf_counter()
    plain = complete(model, tokenizer, ids, settings, None, ngram_filter=filt)
    plain_seconds = time.perf_counter() - started
    started = time.perf_counter()
    guarded = complete(model, tokenizer, ids, settings, guard)
    guarded_seconds = time.perf_counter() - started

    _show(tokenizer, prompts, plain, guarded, args.show)
    copied = sum(1 for c in plain if c.stored_ngrams)
    still = sum(1 for c in guarded if c.stored_ngrams)
    print(
        f"\ncompletions holding a stored stdlib 10-gram: unguarded {copied} of {len(plain)} "
        f"({sum(c.stored_ngrams or 0 for c in plain)} stored 10-grams), "
        f"guarded {still} of {len(guarded)}"
    )
    print(
        "in their text tokenized again: "
        f"unguarded {sum(1 for c in plain if c.stored_text_ngrams)}, guarded "
        f"{sum(1 for c in guarded if c.stored_text_ngrams)} of {len(guarded)} "
        f"(stored 10-grams in guarded text: {sum(c.stored_text_ngrams or 0 for c in guarded)})"
    )
    print(
        f"generation time: unguarded {plain_seconds:.1f} s, guarded {guarded_seconds:.1f} s "
        f"({guarded_seconds / plain_seconds:.2f}x); the guard skipped "
        f"{guard.stats.summary()['fraction_skipped']:.0%} of the last batch's row-steps exactly"
    )
    print(f"the guard's promise: {guard.setup.promise}")
    print(
        "\nThis token guard stops verbatim copies only: near-copies (changed case, spacing, "
        "comments, _ names) pass. The word guard (memfree build --unit word) stops those too; "
        "`memfree eval styles` measures both."
    )
    return 1 if still or any(c.stored_text_ngrams for c in guarded) else 0


def _model_and_filter(output: Path) -> tuple[Any, Any, Any]:
    """The default model, its tokenizer, and the stdlib filter at ``output`` (built if missing)."""
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree import NgramFilter
    from memfree.errors import DamagedFilterError
    from memfree.models import load_model
    from memfree.vocab.tokenizer import cache_dir

    started = time.perf_counter()
    print("loading SmolLM2-135M-Instruct (de-quantized once, then cached) ...", flush=True)
    model, tokenizer = load_model()
    print(f"  loaded in {time.perf_counter() - started:.1f} s (cache: {cache_dir()})")
    if output.exists():
        try:
            found = NgramFilter.open(output)
        except DamagedFilterError as error:  # e.g. written by an earlier memfree: build anew
            print(f"cannot reuse {output} ({error}); building it again")
        else:
            print(f"reusing {output} (delete it to rebuild)")
            return model, tokenizer, found
    print("building a filter of the standard library's 10-grams ...", flush=True)
    summary = build_filter(["stdlib:"], output, BuildSettings(), tokenizer=tokenizer)
    print(summary.to_text())
    return model, tokenizer, NgramFilter.open(output)


def _show(
    tokenizer: Any,
    prompts: list[tuple[str, list[int]]],
    plain: list[Any],
    guarded: list[Any],
    show: int,
) -> None:
    """The ``show`` most-copied prompts side by side, then a table of every prompt."""
    from memfree.cli.common import explain, side_by_side

    order = sorted(range(len(prompts)), key=lambda i: -(plain[i].stored_ngrams or 0))
    for index in order[:show]:
        name, ids = prompts[index]
        print(f"\n── {name} " + "─" * max(0, 70 - len(name)))
        prompt_text = str(tokenizer.decode(ids))
        print("\n".join("  │ " + line for line in prompt_text.split("\n")))
        print(
            side_by_side(
                f"unguarded: {plain[index].stored_ngrams} stored 10-grams",
                plain[index].text,
                f"guarded: {guarded[index].stored_ngrams} stored, "
                f"{len(guarded[index].interventions)} blocked",
                explain(tokenizer, guarded[index], color=sys.stdout.isatty()),
            )
        )
    print("\n  prompt (stdlib module)                    unguarded   guarded   interventions")
    for index, (name, _) in enumerate(prompts):
        print(
            f"  {name[:40]:40s} {plain[index].stored_ngrams:9d} {guarded[index].stored_ngrams:9d}"
            f" {len(guarded[index].interventions):15d}"
        )


if __name__ == "__main__":
    sys.exit(main())
