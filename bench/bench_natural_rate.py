"""Benchmark: false positives on natural queries, against the exact set, beside the uniform figure.

The standard library's modules are split by file: nine in ten are the corpus (every 10-gram of
SmolLM2's tokenization stored), the rest are held out. Every held-out 10-gram that is not stored
is a natural query: a real prefix and the token that really follows it. Each layout at its
default rate (the prefix index at 1e-5 per natural query, the Bloom layout at 1e-3 per n-gram
test) answers them; the share it reports stored is its natural false-positive rate. The same
prefixes with a uniformly drawn last token give the uniform figure (what the index's rate once
assumed). Also: bytes per stored n-gram, the rates each header states, and the index's widths.
"""

from __future__ import annotations

import argparse
import os
import platform
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(
            d for d in subdirectories if d not in ("site-packages", "__pycache__")
        )
        files += [Path(directory) / name for name in sorted(names) if name.endswith(".py")]
    return files


def windows(tokenizer: Any, files: list[Path], n: int) -> np.ndarray:
    parts = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = np.array(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        if ids.size >= n:
            parts.append(np.lib.stride_tricks.sliding_window_view(ids, n))
    return np.concatenate(parts)


def not_stored(queries: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """The rows of ``queries`` that are not rows of ``stored`` (exact, by row bytes)."""
    view = np.dtype((np.void, stored.dtype.itemsize * stored.shape[1]))
    stored_rows = np.ascontiguousarray(stored).view(view).ravel()
    query_rows = np.ascontiguousarray(queries).view(view).ravel()
    return queries[~np.isin(query_rows, stored_rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--held-out", type=float, default=0.1, help="share of files held out")
    args = parser.parse_args()

    from memfree.filterfile import NgramFilter
    from memfree.filterfile.index import IndexFilter
    from memfree.vocab.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    vocab = len(tokenizer)
    files = stdlib_files()
    order = np.random.default_rng(0).permutation(len(files))
    cut = int(len(files) * (1 - args.held_out))
    started = time.perf_counter()
    stored = np.unique(windows(tokenizer, [files[i] for i in order[:cut]], args.n), axis=0)
    held = windows(tokenizer, [files[i] for i in order[cut:]], args.n)
    natural = not_stored(held, stored)
    uniform = natural.copy()
    uniform[:, -1] = np.random.default_rng(1).integers(0, vocab, size=natural.shape[0])
    uniform = not_stored(uniform, stored)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs; stdlib {len(files)} modules, "
        f"{cut} stored ({stored.shape[0]:,} distinct {args.n}-grams), {len(files) - cut} held "
        f"out: {natural.shape[0]:,} natural queries not stored, {uniform.shape[0]:,} uniform "
        f"({time.perf_counter() - started:.0f} s to tokenize)"
    )
    with tempfile.TemporaryDirectory() as directory:
        index = IndexFilter.from_ngrams(Path(directory) / "i", stored, vocab_size=vocab)
        bloom = NgramFilter.from_ngrams(Path(directory) / "b", stored)
        print(
            f"\n{'layout':<24}{'B/n-gram':>9}{'stated':>10}{'natural':>10}{'uniform':>10}"
            f"{'natural hits':>14}"
        )
        for name, filt in (("prefix index (1e-5)", index), ("Bloom blocked-512 (1e-3)", bloom)):
            hits = int(filt.contains(natural).sum())
            measured_uniform = float(filt.contains(uniform).mean())
            print(
                f"{name:<24}{filt.size_bytes / len(filt):>9.2f}"
                f"{filt.expected_false_positive_rate:>10.2g}{hits / natural.shape[0]:>10.2g}"
                f"{measured_uniform:>10.2g}{hits:>14,}"
            )
        metadata = index.metadata
        shape = index.prefix_index().shape
        concentration = metadata["concentration_squares"] / metadata["concentration_sample"] ** 2
        print(
            f"\nindex: remainder {shape.remainder_bits} bits, token {shape.token_bits}, buckets "
            f"2**{shape.bucket_bits}; next tokens' concentration {concentration:.3g} "
            f"({concentration * vocab:.0f}x uniform); stated per natural query "
            f"{metadata['expected_false_positive_rate']:.3g}, per candidate of a whole-vocabulary "
            f"row {metadata['uniform_false_positive_rate']:.3g}, any query at most "
            f"{metadata['prefix_collision_rate']:.3g}"
        )


if __name__ == "__main__":
    main()
