"""Benchmark: the cost of one decoding step's full-vocabulary mask, and of per-key queries.

Per step the guard needs, for each row, which of the V vocabulary tokens complete a stored
n-gram. Compared in one run on one filter of stdlib size (6.5M n-grams, FPR 1e-3):
memfree's torch path (eager and torch.compile), memfree's numpy path, and pybloomfiltermmap3's
own C loop over the same V keys (the interchange format, queried through the library).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from memfree.filterfile.bloom import bits_from_fingerprints
from memfree.filterfile.hashing import (
    extend_fingerprints_torch,
    fingerprints_np,
    prefix_states_torch,
    query_bits_torch,
)
from memfree.filterfile.sizing import choose_size


def best_of(function: Callable[[], object], repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-ngrams", type=int, default=6_500_000)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    fingerprints = rng.integers(0, 2**63, size=args.num_ngrams, dtype=np.uint64) * np.uint64(2)
    size = choose_size(args.num_ngrams, 1e-3)
    words_np = bits_from_fingerprints(fingerprints, size.num_blocks, size.num_probes)
    words = torch.from_numpy(words_np.view(np.int64))
    prefix = torch.from_numpy(rng.integers(0, args.vocab, size=(1, args.n - 1)))
    vocab = torch.arange(args.vocab)

    def eager() -> torch.Tensor:
        states = prefix_states_torch(prefix)
        return query_bits_torch(words, extend_fingerprints_torch(states, vocab), size.num_probes)

    compiled_fn = torch.compile(eager, dynamic=False)
    prefix_np = prefix.numpy()

    def numpy_path() -> np.ndarray:
        ngrams = np.concatenate(
            [np.repeat(prefix_np, args.vocab, axis=0), np.arange(args.vocab)[:, None]], 1
        )
        from memfree.filterfile.hashing import query_bits_np

        return query_bits_np(words_np, fingerprints_np(ngrams), size.num_probes)

    results = {"memfree torch eager": best_of(eager, args.repeats)}
    try:
        results["memfree torch.compile"] = best_of(compiled_fn, args.repeats)
    except Exception as error:  # a compiler toolchain may be missing; report, don't hide
        print(f"torch.compile unavailable: {type(error).__name__}: {error}")
    results["memfree numpy"] = best_of(numpy_path, max(3, args.repeats // 4))
    assert torch.equal(eager()[0], torch.from_numpy(numpy_path())), "torch and numpy paths disagree"

    try:
        import pybloomfilter

        with tempfile.TemporaryDirectory() as directory:
            library = pybloomfilter.BloomFilter(
                args.num_ngrams, 1e-3, str(Path(directory) / "b.bloom")
            )
            keys = np.concatenate(
                [np.repeat(prefix_np, args.vocab, axis=0), np.arange(args.vocab)[:, None]], 1
            )
            key_bytes = [row.tobytes() for row in keys.astype("<u4")]
            results["pybloomfiltermmap3 C loop"] = best_of(
                lambda: [key in library for key in key_bytes], max(3, args.repeats // 4)
            )
    except ImportError:
        print("pybloomfiltermmap3 not installed: pip install 'memfree[interchange]'")

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread"
    )
    print(
        f"one row, full vocabulary of {args.vocab:,}, {args.num_ngrams:,} stored {args.n}-grams, "
        f"{size.num_probes} probes"
    )
    base = results["memfree torch eager"]
    for name, seconds in results.items():
        print(f"  {name:28s} {seconds * 1e3:8.2f} ms/row/step   {seconds / base:5.2f}x eager")


if __name__ == "__main__":
    main()
