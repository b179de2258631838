"""Benchmark: the prefix-keyed index against the blocked Bloom layout, in one run.

- Size per stored n-gram and false bans per candidate: on 4M random 10-grams (each layout at
  its default rate: Bloom 1e-3 per n-gram test, index 1e-5 per candidate), queried with 4M
  n-grams that are not stored (the same prefixes with other next tokens, and new prefixes).
- One guard step (the core's ``banned_mask``), every row checked (its last 9 tokens begin a
  stored n-gram), at batch 1, 8 and 64, at the default vocabulary (49,152) and a synthetic
  256k-token one (a filter of the same random n-grams over 262,144 ids): ms per step.
- On the stdlib filter of the default model (``out/``: built if missing), memorized contexts
  (every row a window of standard-library code): bans per checked row, true (the n-gram is in
  the corpus: checked against an index built at a 1e-9 rate) and false, for both layouts.
- Cold start: the index file evicted from the page cache (``posix_fadvise(DONTNEED)``), a fresh
  process opens it (header and section table checked; sections not read) and runs one batch-8
  step: ms for the open and the step, against the same with the file cached.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memfree.core.token import TokenMasker
from memfree.core.token_index import IndexMasker
from memfree.filterfile import NgramFilter
from memfree.filterfile.index import IndexFilter

_COLD = """
import os, sys, tempfile, time, numpy as np, torch
from memfree.filterfile import open_filter
from memfree.filterfile.index import IndexFilter
from memfree.core.token_index import IndexMasker
rows = torch.tensor(eval(sys.argv[2]))
if sys.argv[3] == "warm":  # the code paths warmed on another, small index first
    with tempfile.TemporaryDirectory() as directory:
        small = IndexFilter.from_ngrams(directory + "/s", np.arange(40).reshape(4, 10), vocab_size=64)
        IndexMasker(small, [0]).banned_mask(rows % 64, 64)
started = time.perf_counter()
filt = open_filter(sys.argv[1])
masker = IndexMasker(filt, [0])
opened = time.perf_counter()
masker.banned_mask(rows, 49152)
stepped = time.perf_counter()
print((opened - started) * 1e3, (stepped - opened) * 1e3)
"""


def best_of(function: Callable[[], object], seconds: float = 0.5) -> float:
    function()
    best, spent = float("inf"), 0.0
    while spent < seconds:
        started = time.perf_counter()
        function()
        took = time.perf_counter() - started
        best, spent = min(best, took), spent + took
    return best


def random_filters(directory: Path, count: int, vocab: int) -> tuple[Any, Any, np.ndarray]:
    rng = np.random.default_rng(vocab)
    ngrams = rng.integers(0, vocab, size=(count, 10))
    bloom = NgramFilter.from_ngrams(directory / f"bloom-{vocab}.memfree", ngrams)
    index = IndexFilter.from_ngrams(directory / f"index-{vocab}.memfree", ngrams, vocab_size=vocab)
    return bloom, index, ngrams


def false_rate(filt: Any, ngrams: np.ndarray, vocab: int) -> tuple[float, float]:
    """False positives among n-grams that are not stored: stored prefixes with another next
    token, and new prefixes (the vocabulary's ids drawn again)."""
    rng = np.random.default_rng(1)
    other_token = ngrams.copy()
    other_token[:, -1] = (other_token[:, -1] + rng.integers(1, vocab, len(ngrams))) % vocab
    fresh = rng.integers(0, vocab, size=ngrams.shape)
    return float(filt.contains(other_token).mean()), float(filt.contains(fresh).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-ngrams", type=int, default=4_000_000)
    parser.add_argument("--stdlib", default="out/stdlib-bloom.memfree")
    parser.add_argument("--skip-stdlib", action="store_true")
    parser.add_argument("--cold-only", action="store_true", help="only the cold-start figures")
    parser.add_argument("--stdlib-only", action="store_true", help="only the stdlib figures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        "(1 thread), CPU; best of repeated calls within 0.5 s"
    )
    if args.stdlib_only:
        stdlib_bans(Path(args.stdlib))
        return
    with tempfile.TemporaryDirectory() as directory:
        for vocab in (49_152, 262_144):
            if args.cold_only:
                rng = np.random.default_rng(vocab)
                ngrams = rng.integers(0, vocab, size=(args.num_ngrams, 10))
                path = Path(directory) / "index.memfree"
                IndexFilter.from_ngrams(path, ngrams, vocab_size=vocab).close()
                print(f"\n{args.num_ngrams:,} random 10-grams over {vocab:,} ids:")
                cold_start(path, ngrams[:8, :-1])
                continue
            bloom, index, ngrams = random_filters(Path(directory), args.num_ngrams, vocab)
            print(f"\n{args.num_ngrams:,} random 10-grams over {vocab:,} ids:")
            for name, filt in (("bloom (fpr 1e-3)", bloom), ("index (1e-5)", index)):
                same, fresh = false_rate(filt, ngrams, vocab)
                print(
                    f"  {name:17s} {filt.size_bytes / len(filt):5.2f} bytes per n-gram; false "
                    f"positives: stored prefix, other token {same:.2e}; new prefix {fresh:.2e}"
                )
            maskers = {"bloom": TokenMasker(bloom, [0]), "index": IndexMasker(index, [0])}
            print("  one guard step, every row's prefix stored (ms):")
            for batch in (1, 8, 64):
                rows = torch.from_numpy(ngrams[:batch, :-1].copy())
                costs = {
                    name: best_of(lambda m=masker, r=rows, v=vocab: m.banned_mask(r, v)) * 1e3
                    for name, masker in maskers.items()
                }
                print(
                    f"    batch {batch:2d}: bloom {costs['bloom']:8.3f}   index "
                    f"{costs['index']:6.3f}   ({costs['bloom'] / costs['index']:.0f}x)"
                )
            bloom.close()
            index.close()
            cold_start(index.path, ngrams[:8, :-1])
    if not (args.skip_stdlib or args.cold_only):
        stdlib_bans(Path(args.stdlib))


def cold_start(path: Path, rows: np.ndarray) -> None:
    """Open and first step in a fresh process, the file evicted or cached, the code paths cold
    (a fresh process's very first step) or warmed on another index first."""
    results = {}
    for code in ("cold", "warm"):
        for state in ("evicted", "cached"):
            if state == "evicted":
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
                    os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            output = subprocess.run(
                [sys.executable, "-c", _COLD, str(path), repr(rows.tolist()), code],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            results[code, state] = [float(value) for value in output]
    print(
        f"  fresh process, {path.stat().st_size / 2**20:.0f} MiB index (verified: the header "
        "and section table at open, each block at its first read), open / first batch-8 step, "
        "ms:"
    )
    for code in ("cold", "warm"):
        label = "first step of the process" if code == "cold" else "code warmed on another index"
        evicted, cached = results[code, "evicted"], results[code, "cached"]
        print(
            f"    {label:30s} file evicted {evicted[0]:6.2f} / {evicted[1]:6.2f}   "
            f"cached {cached[0]:6.2f} / {cached[1]:6.2f}"
        )


def stdlib_bans(bloom_path: Path) -> None:
    """Bans per checked row on memorized contexts of the default model's stdlib filter."""
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree.cli.demo import stdlib_prompts
    from memfree.filterfile import open_filter
    from memfree.vocab.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    paths = {
        "bloom": bloom_path,
        "index": bloom_path.with_name("stdlib-index.memfree"),
        "oracle": bloom_path.with_name("stdlib-index-1e-9.memfree"),
    }
    settings = {
        "bloom": BuildSettings(layout="blocked-512"),
        "index": BuildSettings(layout="prefix-index"),
        # the reference: 1e-9 false bans per natural query (the widest a 64-bit key reaches)
        "oracle": BuildSettings(layout="prefix-index", false_positive_rate=1e-9),
    }
    for name, path in paths.items():
        if not path.exists():
            build_filter(["stdlib:"], path, settings[name], tokenizer=tokenizer, progress=False)
    filters = {name: open_filter(path) for name, path in paths.items()}
    oracle = filters["oracle"]
    rows = []
    for _, ids in stdlib_prompts(tokenizer, 40):
        for end in range(12, len(ids)):
            rows.append(ids[end - 9 : end])
    contexts = torch.tensor(rows)
    print(f"\nstdlib filter ({len(filters['bloom']):,} 10-grams), {len(rows)} memorized contexts:")
    for name in ("bloom", "index"):
        filt = filters[name]
        masker = TokenMasker(filt, [0]) if name == "bloom" else IndexMasker(filt, [0])
        mask, _ = masker.banned_mask(contexts, 49_152)
        row_of, token = np.nonzero(mask.numpy())
        ngrams = np.concatenate([contexts.numpy()[row_of], token[:, None]], axis=1)
        true = oracle.contains(ngrams) if len(ngrams) else np.zeros(0, bool)
        checked = int(mask.any(dim=1).sum())
        cost = best_of(lambda m=masker: m.banned_mask(contexts[:8], 49_152)) * 1e3
        print(
            f"  {name:5s}: {filt.size_bytes / len(filt):.2f} bytes per n-gram; per checked row "
            f"{true.sum() / max(checked, 1):.2f} true bans, {(~true).sum() / max(checked, 1):.3f} "
            f"false ({checked} rows checked); batch-8 step {cost:.3f} ms"
        )


if __name__ == "__main__":
    main()
