"""Benchmark: build a filter over this Python's standard library with the default tokenizer.

Prints tokens/s end to end and with tokenization excluded, n-grams hashed and counted per second
per core, peak memory, file size against the theoretical minimum, and the measured false-positive
rate (random 10-grams) against the target. All figures come from this one run.

``--ratio`` instead times, one after the other in fresh processes, the bare tokenizer
(``encode_batch`` on one thread, over the documents the build reads, 64 at a time) and a
one-worker ``memfree build stdlib:`` (the whole command), and prints their ratio.

``--memory-check`` instead builds a 40 MB single-line file with one worker at ``--memory-limit
256M`` (and a one-line file for the baseline), each in a fresh process, and prints their peak
resident memory: the memory limit must hold while tokenizing one huge line.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from memfree import NgramFilter
from memfree.vocab.tokenizer import load_tokenizer

PEAK = """
import sys
from memfree.cli import main
code = main(sys.argv[1:])
# VmHWM: the peak of this program alone (ru_maxrss would include the parent's size at fork)
peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
print(int(peak) // 1024, file=sys.stderr)
sys.exit(code)
"""


def peak_mib(corpus: Path, limit: str) -> int:
    """Peak resident MiB of `memfree build CORPUS --workers 1 --memory-limit LIMIT` (one process)."""
    output = corpus.with_suffix(".memfree")
    done = subprocess.run(
        [sys.executable, "-c", PEAK, "build", str(corpus), "-o", str(output), "--workers", "1",
         "--memory-limit", limit, "--no-progress"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(done.stderr.split()[-1])


def memory_check(size_mib: int = 40, limit: str = "256M") -> None:
    words = ["def", "return", "self", "import", "class", "(x)", "+=", "1234", "for", "in"]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as directory:
        huge, tiny = Path(directory) / "huge.txt", Path(directory) / "tiny.txt"
        text = " ".join(rng.choice(words, size=size_mib * (1 << 20) // 5))
        huge.write_text(text[: size_mib << 20])
        tiny.write_text(text[:1000])
        baseline, peak = peak_mib(tiny, limit), peak_mib(huge, limit)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores")
    print(
        f"one {size_mib} MiB line, --memory-limit {limit}, 1 worker: peak {peak} MiB "
        f"(a one-line file: {baseline} MiB; difference {peak - baseline} MiB)"
    )


BARE = """
import os, sys, time
os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as one build worker
from bloom_builder.sources import ProblemLog, SourceOptions, discover, read_unit
from memfree.vocab.tokenizer import load_tokenizer
backend = load_tokenizer(None).backend_tokenizer
options = SourceOptions()
texts = [d.text for u in discover(["stdlib:"], options, ProblemLog())
         for d in read_unit(u, options, ProblemLog())]
started = time.perf_counter()
tokens = 0
for begin in range(0, len(texts), 64):
    encoded = backend.encode_batch(texts[begin : begin + 64], add_special_tokens=False)
    tokens += sum(len(e.ids) for e in encoded)
print(time.perf_counter() - started, tokens, file=sys.stderr)
"""


def tokenizer_ratio(extra: tuple[str, ...] = ()) -> None:
    """Print the bare tokenizer's time, one-worker builds' (each ``extra`` set of options: the
    default layout and memory, then ``--memory-limit 512M``, then the Bloom layout), and their
    ratios (one run)."""
    done = subprocess.run([sys.executable, "-c", BARE], capture_output=True, text=True, check=True)
    bare, tokens = done.stderr.split()[-2:]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores")
    print(f"bare tokenizer, one thread: {float(bare):.1f} s for {int(tokens):,} tokens")
    for options in ((), ("--memory-limit", "512M"), ("--layout", "blocked-512"), *extra):
        with tempfile.TemporaryDirectory() as directory:
            output = Path(directory) / "stdlib.memfree"
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "memfree.cli", "build", "stdlib:", "-o", str(output),
                 "--workers", "1", "--no-progress", *options],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            build = time.perf_counter() - started
        label = " ".join(options) or "(defaults: the prefix index, 2G)"
        print(
            f"memfree build stdlib: --workers 1 {label}: {build:.1f} s, "
            f"{build / float(bare):.2f}x the bare tokenizer"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--fpr", type=float, default=1e-3)
    parser.add_argument("--queries", type=int, default=4_000_000)
    parser.add_argument("--memory-check", action="store_true")
    parser.add_argument("--ratio", action="store_true")
    args = parser.parse_args()
    if args.memory_check:
        memory_check()
        return
    if args.ratio:
        tokenizer_ratio()
        return

    tokenizer = load_tokenizer(None)  # cached after the first load; not part of the timing
    settings = BuildSettings(workers=args.workers, false_positive_rate=args.fpr)
    with tempfile.TemporaryDirectory() as directory:
        output = Path(directory) / "stdlib.memfree"
        summary = build_filter(["stdlib:"], output, settings, progress=False, tokenizer=tokenizer)
        filt = NgramFilter.open(output)
        rng = np.random.default_rng(0)
        # Random 10-grams of ids the tokenizer can produce: absent from the corpus for certain in
        # practice (a stdlib 10-gram drawn at random has probability ~1e-38).
        queries = rng.integers(0, len(tokenizer), size=(args.queries, settings.ngram_size))
        # The n-gram bit array alone (what the formula describes), then with the prefix section
        # (membership needs both; random prefixes almost never begin a stored n-gram).
        from memfree.filterfile.hashing import fingerprints_np

        measured = float(filt.contains_fingerprints(fingerprints_np(queries)).mean())
        measured_with_prefix = float(filt.contains(queries).mean())
        prefix = filt.metadata.get("prefix") or {}
        array_bytes = filt.num_bits // 8

    self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    tokenize_wall = summary.seconds_tokenizing / summary.workers
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        f"corpus: stdlib, {summary.documents:,} documents, {summary.tokens:,} tokens, "
        f"{summary.ngrams:,} 10-grams, {summary.distinct_ngrams:,} distinct"
    )
    print(f"workers: {summary.workers}")
    print(f"end to end: {summary.seconds:.1f} s, {summary.tokens / summary.seconds:,.0f} tokens/s")
    print(
        f"tokenization excluded: {summary.tokens / max(summary.seconds - tokenize_wall, 1e-9):,.0f} tokens/s "
        f"(tokenizing took {summary.seconds_tokenizing:.1f} core-s)"
    )
    print(
        f"hash + count per core: {summary.ngrams / summary.seconds_hashing_counting:,.0f} n-grams/s "
        f"({summary.seconds_hashing_counting:.1f} s of the tasks' wall time); per CPU-second "
        f"{summary.ngrams / summary.cpu_seconds_hashing_counting:,.0f} n-grams/s "
        f"({summary.cpu_seconds_hashing_counting:.1f} CPU-s: waits for the disk excluded)"
    )
    print(
        f"tokenize per core: {summary.tokens / max(summary.seconds_tokenizing, 1e-9):,.0f} tokens/s"
    )
    print(f"peak memory: parent {self_peak:,.0f} MiB, largest worker {child_peak:,.0f} MiB")
    print(
        f"file: {summary.size_bytes:,} bytes; n-gram array {array_bytes:,} bytes = "
        f"{array_bytes / summary.theoretical_minimum_bytes:.2f}x the theoretical minimum for "
        f"{summary.kept_ngrams:,} n-grams at {args.fpr:g}; prefix section "
        f"{prefix.get('num_bits', 0) // 8:,} bytes for {summary.kept_prefixes:,} prefixes"
    )
    print(
        f"false-positive rate of the n-gram array: measured {measured:.3g} on {args.queries:,} "
        f"random 10-grams, formula {summary.expected_false_positive_rate:.3g}, target {args.fpr:g} "
        f"(measured/target {measured / args.fpr:.2f}); with the prefix section "
        f"{measured_with_prefix:.3g}"
    )


if __name__ == "__main__":
    main()
