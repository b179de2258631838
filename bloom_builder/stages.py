"""The build's map and reduce stages, and the local executor that runs them.

Each stage is a plain function of a small picklable task that reads and writes files in the work
directory and ends by atomically writing a ``.json`` marker: a task whose marker exists is done,
so an interrupted build resumes where it stopped, and any engine that can run a function over a
list of tasks (a process pool here; a cluster scheduler later) can run the same stages.

    map:    shard of work units -> documents -> token ids -> n-gram fingerprints -> sorted runs
            (and, for the prefix section, the (n-1)-token prefix of each n-gram occurrence)
    reduce: key range -> total count of each fingerprint across runs -> kept fingerprints (>= K)

Windows that hold a special token (end of sequence, chat markers, ...) are never counted: the
guard never blocks a special token, so no stored n-gram may contain one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bloom_builder.counting import Run, RunWriter, count_range
from bloom_builder.segments import SEGMENT_BYTES, split_long, take_batch
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit, read_unit
from memfree.hashing import sliding_fingerprints_np


def write_marker(path: Path, payload: dict[str, Any]) -> None:
    """Atomically write a JSON completion marker."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(payload, out, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def read_marker(path: Path) -> dict[str, Any] | None:
    """A completion marker's payload, or None if absent or unreadable (then the task reruns)."""
    try:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


# ------------------------------------------------------------------------------------------------
# Tokenization inside workers


class BatchEncoder:
    """Encodes batches of documents to token ids with a Hugging Face tokenizer.

    Fast tokenizers travel to workers as their ``tokenizers`` JSON (workers then never import
    transformers); other tokenizers travel pickled.
    """

    def __init__(
        self, backend_json: str | None, pickled: bytes | None, special_ids: tuple[int, ...] = ()
    ) -> None:
        self.special_ids = np.asarray(special_ids, dtype=np.uint32)
        self._backend: Any = None
        self._slow: Any = None
        if backend_json is not None:
            from tokenizers import Tokenizer

            self._backend = Tokenizer.from_str(backend_json)
            self._backend.no_truncation()
            self._backend.no_padding()
        elif pickled is not None:
            import pickle

            self._slow = pickle.loads(pickled)
        else:
            raise ValueError("a BatchEncoder needs a backend tokenizer or a pickled tokenizer")

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (uint32 arrays) of each text, without special tokens."""
        if self._backend is not None:
            encodings = self._backend.encode_batch(texts, add_special_tokens=False)
            return [np.asarray(encoding.ids, dtype=np.uint32) for encoding in encodings]
        ids = self._slow(texts, add_special_tokens=False)["input_ids"]
        return [np.asarray(row, dtype=np.uint32) for row in ids]


@dataclass(frozen=True)
class TokenizerPayload:
    """What a worker needs to rebuild the tokenizer."""

    backend_json: str | None
    pickled: bytes | None
    special_ids: tuple[int, ...] = ()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenizerPayload:
        from memfree.tokenizer import special_token_ids

        special = special_token_ids(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and getattr(tokenizer, "is_fast", False):
            return cls(backend.to_str(), None, special)
        import pickle

        return cls(None, pickle.dumps(tokenizer), special)

    def encoder(self) -> BatchEncoder:
        return BatchEncoder(self.backend_json, self.pickled, self.special_ids)


class WordEncoder:
    """Turns documents into the hashes of their normalized words (no tokenizer)."""

    special_ids = np.empty(0, dtype=np.uint32)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        from memfree.words import text_word_hashes

        return [text_word_hashes(text) for text in texts]


@dataclass(frozen=True)
class WordPayload:
    """What a worker needs for the word unit: nothing but the normalizer's version."""

    normalizer: str

    def encoder(self) -> WordEncoder:
        from memfree.words import NORMALIZER

        if self.normalizer != NORMALIZER:  # pragma: no cover - one process tree, one memfree
            raise RuntimeError(f"worker normalizer {NORMALIZER} != {self.normalizer}")
        return WordEncoder()


_ENCODER: BatchEncoder | WordEncoder | None = None


def init_worker(payload: TokenizerPayload | WordPayload) -> None:
    """Process-pool initializer: build the tokenizer once per worker."""
    global _ENCODER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _ENCODER = payload.encoder()


def window_fingerprints(
    token_ids: np.ndarray, ngram_size: int, seed: int, special_ids: np.ndarray, prefixes: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Fingerprints of the n-grams of one sequence that hold no special token, in order.

    Args:
        token_ids: uint32 `(num_tokens,)`.
        ngram_size: n.
        seed: hash seed.
        special_ids: ids that cut the sequence.
        prefixes: also return the fingerprint of each kept n-gram's (n-1)-token prefix.

    Returns:
        (uint64 n-gram fingerprints, uint64 prefix fingerprints of the same windows or None).
    """
    fingerprints = sliding_fingerprints_np(token_ids, ngram_size, seed)
    prefix_fingerprints = None
    if prefixes and ngram_size > 1:
        prefix_fingerprints = sliding_fingerprints_np(token_ids[:-1], ngram_size - 1, seed)
    if fingerprints.size and special_ids.size:
        special = np.isin(token_ids, special_ids)
        if special.any():
            cumulative = np.concatenate(([0], np.cumsum(special)))
            clean = (
                cumulative[ngram_size:] == cumulative[: -ngram_size or None][: fingerprints.size]
            )
            fingerprints = fingerprints[clean]
            if prefix_fingerprints is not None:
                prefix_fingerprints = prefix_fingerprints[clean]
    return fingerprints, prefix_fingerprints


# ------------------------------------------------------------------------------------------------
# Map


@dataclass(frozen=True)
class MapTask:
    """One shard: a few work units whose n-gram fingerprints end up in sorted runs."""

    index: int
    units: tuple[WorkUnit, ...]
    work_dir: str
    ngram_size: int
    hash_seed: int
    batch_documents: int
    buffer_entries: int
    options: SourceOptions
    prefixes: bool = True
    batch_bytes: int = 4 * SEGMENT_BYTES  # text tokenized at once (the memory it may take)

    @property
    def marker(self) -> Path:
        return Path(self.work_dir) / "map" / f"shard-{self.index:05d}.json"

    @property
    def run_dir(self) -> Path:
        return Path(self.work_dir) / "map" / f"shard-{self.index:05d}"


@dataclass
class MapStats:
    """What a map task saw; summed over tasks in a fixed order for the summary."""

    documents: int = 0
    tokens: int = 0
    ngrams: int = 0
    input_bytes: int = 0
    seconds_reading: float = 0.0
    seconds_tokenizing: float = 0.0
    seconds_hashing: float = 0.0
    problems: dict[str, Any] = field(default_factory=dict)

    def add(self, other: MapStats) -> None:
        self.documents += other.documents
        self.tokens += other.tokens
        self.ngrams += other.ngrams
        self.input_bytes += other.input_bytes
        self.seconds_reading += other.seconds_reading
        self.seconds_tokenizing += other.seconds_tokenizing
        self.seconds_hashing += other.seconds_hashing


def map_shard(task: MapTask) -> dict[str, Any]:
    """Run one map task (or reuse its finished output). Returns its marker payload."""
    done = read_marker(task.marker)
    if done is not None and all(
        Path(stem + ".keys").exists() for stem in done["runs"] + done["prefix_runs"]
    ):
        done["reused"] = True
        return done
    if _ENCODER is None:
        raise RuntimeError("init_worker() must run before map_shard()")
    shutil.rmtree(task.run_dir, ignore_errors=True)
    prefixes = task.prefixes and task.ngram_size > 1
    share = task.buffer_entries // 2 if prefixes else task.buffer_entries
    writer = RunWriter(task.run_dir / "ngrams", max(share, 1))
    prefix_writer = RunWriter(task.run_dir / "prefixes", max(share, 1)) if prefixes else None
    stats = MapStats()
    problems = ProblemLog()
    for unit in task.units:
        stats.input_bytes += unit.size_bytes
        _map_unit(unit, task, _ENCODER, writer, prefix_writer, stats, problems)
    started = time.perf_counter()
    runs = writer.close()
    prefix_runs = prefix_writer.close() if prefix_writer else []
    stats.seconds_hashing += time.perf_counter() - started
    stats.problems = problems.to_dict()
    payload = {
        "stats": asdict(stats),
        "runs": [str(run.stem) for run in runs],
        "prefix_runs": [str(run.stem) for run in prefix_runs],
        "reused": False,
    }
    write_marker(task.marker, payload)
    return payload


def _map_unit(
    unit: WorkUnit,
    task: MapTask,
    encoder: BatchEncoder | WordEncoder,
    writer: RunWriter,
    prefix_writer: RunWriter | None,
    stats: MapStats,
    problems: ProblemLog,
) -> None:
    carry = np.empty(0, dtype=np.uint32)  # last n-1 ids (words) of a document continued later
    continuing = False
    documents = split_long(read_unit(unit, task.options, problems))
    while True:
        started = time.perf_counter()
        batch = take_batch(documents, task.batch_documents, task.batch_bytes)
        stats.seconds_reading += time.perf_counter() - started
        if not batch:
            return
        started = time.perf_counter()
        encoded = encoder.encode([document.text for document in batch])
        stats.seconds_tokenizing += time.perf_counter() - started
        started = time.perf_counter()
        for document, ids in zip(batch, encoded, strict=True):
            stats.documents += 0 if continuing else 1
            stats.tokens += ids.size
            if carry.size:
                ids = np.concatenate((carry, ids))
            fingerprints, prefix_fingerprints = window_fingerprints(
                ids, task.ngram_size, task.hash_seed, encoder.special_ids, prefix_writer is not None
            )
            stats.ngrams += fingerprints.size
            writer.add(fingerprints)
            if prefix_writer is not None and prefix_fingerprints is not None:
                prefix_writer.add(prefix_fingerprints)
            continuing = document.continues
            keep = task.ngram_size - 1 if continuing else 0
            carry = ids[ids.size - keep :] if keep else ids[:0]
        stats.seconds_hashing += time.perf_counter() - started


# ------------------------------------------------------------------------------------------------
# Reduce


@dataclass(frozen=True)
class ReduceTask:
    """One key range: count across all runs, keep fingerprints seen at least min_count times."""

    index: int
    low: int
    high: int
    runs: tuple[str, ...]
    min_count: int
    max_entries: int
    out_dir: str
    kind: str = "ngrams"

    @property
    def marker(self) -> Path:
        return Path(self.out_dir) / f"{self.kind}-{self.index:05d}.json"

    @property
    def kept_path(self) -> Path:
        return Path(self.out_dir) / f"{self.kind}-{self.index:05d}.u64"


def reduce_partition(task: ReduceTask) -> dict[str, Any]:
    """Run one reduce task (or reuse it). Returns its marker payload."""
    done = read_marker(task.marker)
    if (
        done is not None
        and task.kept_path.exists()
        and task.kept_path.stat().st_size == done["kept"] * 8
    ):
        done["reused"] = True
        return done
    distinct = kept = 0
    started = time.perf_counter()
    with open(task.kept_path, "wb") as out:
        for fingerprints, counted in count_range(
            [Run(Path(stem)) for stem in task.runs],
            task.low,
            task.high,
            task.min_count,
            task.max_entries,
        ):
            out.write(fingerprints.astype("<u8").data.cast("B"))
            distinct += counted.distinct
            kept += counted.kept
        out.flush()
        os.fsync(out.fileno())
    payload = {
        "distinct": distinct,
        "kept": kept,
        "seconds": time.perf_counter() - started,
        "reused": False,
    }
    write_marker(task.marker, payload)
    return payload


def read_kept(task: ReduceTask) -> np.ndarray:
    """The kept fingerprints of a finished reduce task (memory-mapped, sorted)."""
    size = task.kept_path.stat().st_size // 8
    if size == 0:
        return np.empty(0, dtype=np.uint64)
    return np.memmap(task.kept_path, dtype="<u8", mode="r", shape=(size,))


# ------------------------------------------------------------------------------------------------
# Executor

TaskT = TypeVar("TaskT")


class LocalExecutor:
    """Runs stage functions over tasks in this process (workers=1) or in a spawned process pool.

    Results come back in completion order with their task, so progress can be shown as they land;
    callers sort by task index where order matters.
    """

    def __init__(self, workers: int, payload: TokenizerPayload | WordPayload) -> None:
        self.workers = workers
        self.payload = payload
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> LocalExecutor:
        if self.workers > 1:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=get_context("spawn"),
                initializer=init_worker,
                initargs=(self.payload,),
            )
        else:
            init_worker(self.payload)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def run(
        self, function: Callable[[TaskT], dict[str, Any]], tasks: Sequence[TaskT]
    ) -> Iterable[tuple[TaskT, dict[str, Any]]]:
        if self._pool is None:
            for task in tasks:
                yield task, function(task)
            return
        from concurrent.futures import as_completed

        futures = {self._pool.submit(function, task): task for task in tasks}
        for future in as_completed(futures):
            yield futures[future], future.result()
