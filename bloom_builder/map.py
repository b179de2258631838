"""The map step: a shard of work units -> n-gram fingerprints -> sorted, counted runs on disk."""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bloom_builder.counting import RunWriter, files_intact
from bloom_builder.encode import Encoder, EncodeSeconds, encoded_batches, worker_encoder
from bloom_builder.segments import SEGMENT_BYTES
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit
from bloom_builder.windows import batch_windows


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

    def outputs_intact(self, result: dict[str, Any]) -> bool:
        """Whether every run file the result names is on disk with the size and xxh3 it had when
        written (a truncated or edited run is never reused; its task runs again)."""
        files = result["files"]
        stems = result["runs"] + result["prefix_runs"]
        expected = {stem + suffix for stem in stems for suffix in (".keys", ".repeats")}
        return set(files) == expected and files_intact(files)


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
    cpu_seconds_hashing: float = 0.0  # of this thread: waits for the disk excluded
    problems: dict[str, Any] = field(default_factory=dict)

    def add(self, other: MapStats) -> None:
        self.documents += other.documents
        self.tokens += other.tokens
        self.ngrams += other.ngrams
        self.input_bytes += other.input_bytes
        self.seconds_reading += other.seconds_reading
        self.seconds_tokenizing += other.seconds_tokenizing
        self.seconds_hashing += other.seconds_hashing
        self.cpu_seconds_hashing += other.cpu_seconds_hashing


def map_shard(task: MapTask) -> dict[str, Any]:
    """Run one map task in a worker set up by :func:`~bloom_builder.encode.init_worker`.

    Reads the task's units, encodes their documents, takes the fingerprint windows of every
    document piece and spills them into sorted runs (and, for the prefix section, runs of each
    window's (n-1)-id prefix). It writes only inside its own run directory; its executor records
    it as done, so a rerun of the build skips it while its runs are intact.

    Returns:
        Its result (the marker's payload): ``stats`` (a :class:`MapStats` dict with the
        problems met), and the stems of the n-gram ``runs`` and ``prefix_runs`` it wrote.
    """
    encoder = worker_encoder()
    shutil.rmtree(task.run_dir, ignore_errors=True)  # what an interrupted attempt left
    prefixes = task.prefixes and task.ngram_size > 1
    share = task.buffer_entries // 2 if prefixes else task.buffer_entries
    writer = RunWriter(task.run_dir / "ngrams", max(share, 1))
    prefix_writer = RunWriter(task.run_dir / "prefixes", max(share, 1)) if prefixes else None
    stats = MapStats()
    problems = ProblemLog()
    for unit in task.units:
        stats.input_bytes += unit.size_bytes
        _map_unit(unit, task, encoder, writer, prefix_writer, stats, problems)
    started, started_cpu = time.perf_counter(), time.thread_time()
    runs = writer.close()
    prefix_runs = prefix_writer.close() if prefix_writer else []
    stats.seconds_hashing += time.perf_counter() - started
    stats.cpu_seconds_hashing += time.thread_time() - started_cpu
    stats.problems = problems.to_dict()
    files = {**writer.files, **(prefix_writer.files if prefix_writer else {})}
    return {
        "stats": asdict(stats),
        "runs": [str(run.stem) for run in runs],
        "prefix_runs": [str(run.stem) for run in prefix_runs],
        "files": files,
    }


def _map_unit(
    unit: WorkUnit,
    task: MapTask,
    encoder: Encoder,
    writer: RunWriter,
    prefix_writer: RunWriter | None,
    stats: MapStats,
    problems: ProblemLog,
) -> None:
    """Add the windows of one unit's documents to the runs; count what was seen."""
    seconds = EncodeSeconds()
    carry = None  # the last n-1 ids of a document piece that the next piece continues
    continuing = False
    for batch in encoded_batches(
        unit, task.options, problems, encoder, task.batch_documents, task.batch_bytes, seconds
    ):
        started, started_cpu = time.perf_counter(), time.thread_time()
        for document, ids in batch:
            stats.documents += 0 if continuing else 1
            stats.tokens += ids.size
            continuing = document.continues
        windows = batch_windows(
            [(ids, document.continues) for document, ids in batch],
            carry,
            task.ngram_size,
            task.hash_seed,
            encoder.special_ids,
            prefix_writer is not None,
        )
        stats.ngrams += windows.fingerprints.size
        writer.add(windows.fingerprints)
        if prefix_writer is not None and windows.prefix_fingerprints is not None:
            prefix_writer.add(windows.prefix_fingerprints)
        carry = windows.carry
        stats.seconds_hashing += time.perf_counter() - started
        stats.cpu_seconds_hashing += time.thread_time() - started_cpu
    stats.seconds_reading += seconds.reading
    stats.seconds_tokenizing += seconds.encoding
