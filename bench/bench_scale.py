"""Benchmark: the builder at scale, on a synthetic pre-tokenized corpus of a billion tokens.

Writes (once, then reuses) a deterministic Megatron indexed dataset (``.bin`` + ``.idx``, uint16
ids for the default tokenizer's 49,152-token vocabulary): documents of log-normal length
(median 600 tokens, mean about 1,000), ids drawn from a Zipf law over a shuffled vocabulary (no
special ids), and in 30% of documents a passage of 64-512 tokens copied from a pool of 20,000
whose popularity is itself Zipf-distributed, so that some 10-grams are seen thousands of times
and ``--min-count`` matters. Then it runs ``memfree build`` on it (the whole command, in a fresh
process) with each executor at 1 and 2 workers and prints, from that one run: tokens/s,
scaling efficiency, hash + count n-grams/s per core, peak resident memory of the driver and of
the largest worker against the per-worker share of ``--memory-limit``, work-directory bytes
per token (kept with ``--keep-work``, measured at the end, when it is largest), and filter size.

It takes a while (about 30 minutes here for 1B tokens): run it in the background, e.g.
``nohup python bench/bench_scale.py > scale.log 2>&1 &``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bloom_builder.sources.megatron import _HEADER, MAGIC

VOCAB = 49_152
FIRST_ID = 17  # the default tokenizer's special ids are 0..16: a corpus holds none
DOCS_PER_CHUNK = 8_192


def write_corpus(prefix: Path, tokens: int, seed: int = 0) -> tuple[int, int]:
    """Write ``prefix.bin`` + ``prefix.idx`` holding at least ``tokens`` tokens.

    Returns:
        (documents, tokens) written.
    """
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(np.arange(FIRST_ID, VOCAB, dtype=np.uint16))
    pool_lengths = rng.integers(64, 513, size=20_000)
    pool = [_zipf_ids(rng, shuffled, int(length)) for length in pool_lengths]
    lengths: list[np.ndarray] = []
    written = 0
    with open(prefix.with_suffix(".bin"), "wb") as out:
        while written < tokens:
            sizes = np.clip(rng.lognormal(np.log(600), 1.0, DOCS_PER_CHUNK), 32, 32_768)
            sizes = sizes.astype(np.int64)
            ids = _zipf_ids(rng, shuffled, int(sizes.sum()))
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
            for document in np.flatnonzero(rng.random(DOCS_PER_CHUNK) < 0.3):
                passage = pool[int(rng.zipf(1.3) - 1) % len(pool)]
                room = int(sizes[document]) - passage.size
                if room >= 0:  # copied over the document's own ids: its length does not change
                    at = int(starts[document]) + int(rng.integers(0, room + 1))
                    ids[at : at + passage.size] = passage
            out.write(ids.tobytes())
            lengths.append(sizes.astype(np.int32))
            written += int(sizes.sum())
    all_lengths = np.concatenate(lengths)
    count = all_lengths.size
    pointers = np.concatenate(([0], np.cumsum(all_lengths.astype(np.int64))[:-1])) * 2
    with open(prefix.with_suffix(".idx"), "wb") as out:
        out.write(_HEADER.pack(MAGIC, 1, 8, count, count + 1))  # dtype code 8: uint16
        out.write(all_lengths.tobytes())
        out.write(pointers.astype(np.int64).tobytes())
        out.write(np.arange(count + 1, dtype=np.int64).tobytes())
    return count, written


def _zipf_ids(rng: np.random.Generator, shuffled: np.ndarray, size: int) -> np.ndarray:
    """``size`` uint16 ids whose ranks follow a Zipf law (s = 1.15) over the shuffled vocabulary."""
    ranks = rng.zipf(1.15, size) - 1
    return shuffled[ranks % shuffled.size]


class PeakMemory:
    """Samples the resident memory of a process and all its descendants (every 0.2 s): the peak
    of its anonymous memory (RssAnon: what the process owns, what --memory-limit governs) and
    VmHWM (the kernel's own peak, which also counts file pages it has mapped)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peaks: dict[int, tuple[int, int, str]] = {}  # pid -> (anon KiB, hwm KiB, role)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                processes = [psutil.Process(self.root)]
                processes += processes[0].children(recursive=True)
            except psutil.Error:
                processes = []
            for process in processes:
                try:
                    anon, hwm = _status_kib(process.pid)
                    role = _role(process.pid, self.root, " ".join(process.cmdline()))
                except (psutil.Error, OSError, KeyError, ValueError):
                    continue  # gone, or a zombie (whose status has no memory lines)
                old = self.peaks.get(process.pid, (0, 0, role))
                self.peaks[process.pid] = (max(anon, old[0]), max(hwm, old[1]), role)
            time.sleep(0.2)

    def stop(self) -> dict[str, list[int]]:
        """Stop sampling; per role (driver, worker, ray system) the largest [anon, hwm] MiB."""
        self._stop.set()
        self._thread.join()
        largest: dict[str, list[int]] = {}
        for anon, hwm, role in self.peaks.values():
            old = largest.get(role, [0, 0])
            largest[role] = [max(old[0], anon // 1024), max(old[1], hwm // 1024)]
        return largest


def _status_kib(pid: int) -> tuple[int, int]:
    """(RssAnon, VmHWM) of a process, KiB."""
    fields = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value
    return int(fields["RssAnon"].split()[0]), int(fields["VmHWM"].split()[0])


def _role(pid: int, root: int, command: str) -> str:
    if pid == root:
        return "driver"
    if "spawn_main" in command or "default_worker" in command or command.startswith("ray::"):
        return "worker"
    return "ray system"


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_build(corpus: Path, out: Path, executor: str, workers: int, args: Any) -> dict[str, Any]:
    """One ``memfree build`` in a fresh process: its summary, wall time, memory and disk."""
    stem = f"{executor}-{workers}-{args.layout}"
    output, work = out / f"{stem}.memfree", out / f"{stem}.work"
    shutil.rmtree(work, ignore_errors=True)
    command = [
        sys.executable, "-m", "memfree.cli", "build", str(corpus), "-o", str(output),
        "--executor", executor, "--workers", str(workers), "--min-count", str(args.min_count),
        "--memory-limit", args.memory_limit, "--work-dir", str(work), "--keep-work",
        "--layout", args.layout,
        "--no-progress", "--json",
    ]  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory = PeakMemory(process.pid)
    stdout, stderr = process.communicate()
    wall = time.perf_counter() - started
    peaks = memory.stop()
    if process.returncode != 0:
        raise SystemExit(f"build failed ({executor}, {workers}):\n{stderr[-3000:]}")
    summary = json.loads(stdout)
    work_bytes = directory_bytes(work)
    shutil.rmtree(work, ignore_errors=True)
    output.unlink()
    return {"executor": executor, "workers": workers, "wall": wall, "summary": summary,
            "peaks_mib": peaks, "work_bytes": work_bytes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=1_000_000_000)
    parser.add_argument("--data-dir", default="/tmp/memfree-scale")
    parser.add_argument("--executors", default="local,ray")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--min-count", type=int, default=2)
    parser.add_argument("--memory-limit", default="2G")
    parser.add_argument("--layout", default="blocked-512", help="or prefix-index")
    parser.add_argument("--json-out", default=None, help="also write the results here")
    args = parser.parse_args()

    data = Path(args.data_dir)
    corpus = data / f"corpus-{args.tokens}"
    corpus.mkdir(parents=True, exist_ok=True)
    prefix = corpus / "synthetic_text_document"
    if not prefix.with_suffix(".idx").exists():
        started = time.perf_counter()
        documents, tokens = write_corpus(prefix, args.tokens)
        print(f"corpus: wrote {documents:,} documents, {tokens:,} tokens in "
              f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    results = []
    for executor in args.executors.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            result = run_build(corpus, data, executor, workers, args)
            results.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "summary"}), flush=True)
    report(results, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


def report(results: list[dict[str, Any]], args: Any) -> None:
    from bloom_builder.settings import parse_size

    limit = parse_size(args.memory_limit)
    first = results[0]["summary"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}")  # fmt: skip
    print(f"corpus: {first['documents']:,} documents, {first['tokens']:,} tokens, "
          f"{first['distinct_ngrams']:,} distinct 10-grams, {first['kept_ngrams']:,} seen at "
          f"least {args.min_count} times, {first['kept_prefixes']:,} prefixes kept")  # fmt: skip
    print("| executor | workers | wall s | tokens/s | scaling | hash + count n-grams/s per core "
          "| peak anonymous RSS (VmHWM), largest worker / share of --memory-limit | driver "
          "| work dir bytes/token "
          "| filter bytes | write step s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    single: dict[str, float] = {}
    for result in results:
        summary, workers = result["summary"], result["workers"]
        rate = summary["tokens"] / result["wall"]
        if workers == 1:
            single[result["executor"]] = rate
        base = single.get(result["executor"])
        scaling = f"{rate / (workers * base):.0%}" if base else "-"
        per_core = summary["ngrams"] / max(summary["seconds_hashing_counting"], 1e-9)
        per_cpu = summary["ngrams"] / max(summary["cpu_seconds_hashing_counting"], 1e-9)
        peaks = result["peaks_mib"]
        # The local executor runs a lone worker's tasks in the driver's process.
        worker = peaks.get("worker") or peaks.get("driver", [0, 0])
        driver = peaks.get("driver", [0, 0])
        print(
            f"| {result['executor']} | {workers} | {result['wall']:.0f} | {rate:,.0f} | {scaling} "
            f"| {per_core:,.0f} ({per_cpu:,.0f} per CPU-s) | {worker[0]:,} ({worker[1]:,}) / "
            f"{limit // workers >> 20:,} MiB | {driver[0]:,} ({driver[1]:,}) MiB "
            f"| {result['work_bytes'] / summary['tokens']:.1f} "
            f"| {summary['size_bytes']:,} | {summary.get('seconds_writing', 0.0):.1f} |"
        )


if __name__ == "__main__":
    main()
