"""The map step: a shard of work units -> n-gram fingerprints -> sorted, counted runs on disk;
what each task saw and wrote comes back as a typed :class:`MapResult`."""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from bloom_builder.counting import FileRecord, RunWriter, files_intact
from bloom_builder.encode import Encoder, EncodeSeconds, encoded_batches, worker_encoder
from bloom_builder.errors import BuildError
from bloom_builder.segments import SEGMENT_BYTES
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit
from bloom_builder.windows import Windows, batch_windows
from memfree.filterfile.hashing import fingerprints_np
from memfree.filterfile.index import index_keys


@dataclass(frozen=True)
class MapStats:
    """What map tasks saw (datatrove-style typed stats): one task's, or several summed with
    ``+`` in a fixed order for the summary (problems merged, first examples kept).

    Attributes:
        documents: documents read (a document cut into pieces counts once).
        tokens: ids encoded (token ids, or words for the word unit).
        ngrams: fingerprint windows spilled into runs.
        input_bytes: the units' estimated uncompressed bytes.
        seconds_reading: wall time reading documents.
        seconds_tokenizing: wall time encoding them.
        seconds_hashing: wall time hashing windows and writing runs.
        cpu_seconds_hashing: CPU time of that, in the task's thread (waits for the disk excluded).
        problems: the inputs skipped while reading.
    """

    documents: int = 0
    tokens: int = 0
    ngrams: int = 0
    input_bytes: int = 0
    seconds_reading: float = 0.0
    seconds_tokenizing: float = 0.0
    seconds_hashing: float = 0.0
    cpu_seconds_hashing: float = 0.0
    problems: ProblemLog = field(default_factory=ProblemLog)

    def __add__(self, other: MapStats) -> MapStats:
        """Both tasks' numbers summed; this one's problems first, then ``other``'s."""
        problems = ProblemLog()
        problems.merge(self.problems)
        problems.merge(other.problems)
        return MapStats(
            **{name: getattr(self, name) + getattr(other, name) for name in _COUNTS + _SECONDS},
            problems=problems,
        )

    def to_json(self) -> dict[str, Any]:
        """The marker's ``stats``: every number, and the problems as :meth:`ProblemLog.to_dict`."""
        numbers = {name: getattr(self, name) for name in _COUNTS + _SECONDS}
        return {**numbers, "problems": self.problems.to_dict()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MapStats:
        """Read a marker's ``stats`` back (a number it lacks is 0)."""
        counts: dict[str, Any] = {name: int(data.get(name, 0)) for name in _COUNTS}
        seconds: dict[str, Any] = {name: float(data.get(name, 0.0)) for name in _SECONDS}
        return cls(**counts, **seconds, problems=ProblemLog.from_dict(data["problems"]))


_COUNTS = ("documents", "tokens", "ngrams", "input_bytes")
_SECONDS = ("seconds_reading", "seconds_tokenizing", "seconds_hashing", "cpu_seconds_hashing")


@dataclass(frozen=True)
class MapResult:
    """What a map task wrote and saw; its marker holds :meth:`to_json`.

    Attributes:
        stats: what the task saw.
        runs: the stems of the n-gram runs it wrote, in order.
        prefix_runs: the stems of its prefix runs (empty without a prefix section).
        files: every run file it wrote -> its record (size, xxh3, times).
        reused: the result comes from the marker of an earlier build, not from running.
    """

    stats: MapStats
    runs: tuple[str, ...]
    prefix_runs: tuple[str, ...]
    files: Mapping[str, FileRecord]
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        """The marker's payload: ``stats``, ``runs``, ``prefix_runs``, ``files`` and ``reused``."""
        return {
            "stats": self.stats.to_json(),
            "runs": list(self.runs),
            "prefix_runs": list(self.prefix_runs),
            "files": {name: record.to_json() for name, record in self.files.items()},
            "reused": self.reused,
        }

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> MapResult:
        """Read a marker's payload back.

        Raises:
            KeyError, TypeError, ValueError: the payload is not a map task's (the task reruns).
        """
        return cls(
            stats=MapStats.from_json(payload["stats"]),
            runs=tuple(str(stem) for stem in payload["runs"]),
            prefix_runs=tuple(str(stem) for stem in payload["prefix_runs"]),
            files={
                str(name): FileRecord.from_json(entry) for name, entry in payload["files"].items()
            },
            reused=bool(payload.get("reused", False)),
        )


@dataclass(frozen=True, kw_only=True)
class MapTask:
    """One shard: a few work units whose n-gram fingerprints end up in sorted runs.

    Attributes:
        index: the shard's place in the build (names its run directory and marker).
        units: the work units it reads, in order.
        work_dir: the build's work directory (absolute: tasks may run on other nodes).
        ngram_size: units per n-gram.
        hash_seed: seed of the n-gram hash.
        batch_documents: documents encoded at once.
        buffer_entries: fingerprints buffered before a run is spilled.
        options: how the units are read.
        prefixes: also write runs of each window's (n-1)-id prefix (for the prefix section).
        batch_bytes: text encoded at once (the memory it may take).
        index_token_bits: for the prefix-keyed index, the bits of a token id: the runs then
            hold each window's index key (its prefix's fingerprint above its last id) instead
            of its fingerprint; 0 for the Bloom layout.
        index_next_words: the units are word hashes: a key keeps the low ``index_token_bits``
            bits of the next word's hash.
    """

    result_type: ClassVar[type[MapResult]] = MapResult

    index: int
    units: tuple[WorkUnit, ...]
    work_dir: str
    ngram_size: int
    hash_seed: int
    batch_documents: int
    buffer_entries: int
    options: SourceOptions
    prefixes: bool = True
    batch_bytes: int = 4 * SEGMENT_BYTES
    index_token_bits: int = 0
    index_next_words: bool = False

    @property
    def marker(self) -> Path:
        return Path(self.work_dir) / "map" / f"shard-{self.index:05d}.json"

    @property
    def run_dir(self) -> Path:
        return Path(self.work_dir) / "map" / f"shard-{self.index:05d}"

    def output_sizes(self, result: MapResult) -> dict[str, int]:
        """The files the task wrote (its runs), as its result names them, and their sizes."""
        return {path: record.size_bytes for path, record in sorted(result.files.items())}

    def outputs_intact(self, result: MapResult) -> bool:
        """Whether every run file the result names is on disk with the size and xxh3 it had when
        written (a truncated or edited run is never reused; its task runs again)."""
        stems = result.runs + result.prefix_runs
        expected = {stem + suffix for stem in stems for suffix in (".keys", ".repeats")}
        return set(result.files) == expected and files_intact(result.files)


def map_shard(task: MapTask) -> MapResult:
    """Run one map task in a worker set up by :func:`~bloom_builder.encode.init_worker`.

    Reads the task's units, encodes their documents, takes the fingerprint windows of every
    document piece and spills them into sorted runs (and, for the prefix section, runs of each
    window's (n-1)-id prefix). It writes only inside its own run directory; its executor records
    it as done, so a rerun of the build skips it while its runs are intact.

    Returns:
        What it saw (with the problems met) and the runs it wrote.
    """
    encoder = worker_encoder()
    shutil.rmtree(task.run_dir, ignore_errors=True)  # what an interrupted attempt left
    prefixes = task.prefixes and task.ngram_size > 1 and not task.index_token_bits
    share = task.buffer_entries // 2 if prefixes else task.buffer_entries
    writer = RunWriter(task.run_dir / "ngrams", max(share, 1))
    prefix_writer = RunWriter(task.run_dir / "prefixes", max(share, 1)) if prefixes else None
    stats = MapStats()
    problems = ProblemLog()
    for unit in task.units:
        stats += _map_unit(unit, task, encoder, writer, prefix_writer, problems)
    started, started_cpu = time.perf_counter(), time.thread_time()
    runs = writer.close()
    prefix_runs = prefix_writer.close() if prefix_writer else []
    closing = MapStats(
        seconds_hashing=time.perf_counter() - started,
        cpu_seconds_hashing=time.thread_time() - started_cpu,
        problems=problems,
    )
    return MapResult(
        stats=stats + closing,
        runs=tuple(str(run.stem) for run in runs),
        prefix_runs=tuple(str(run.stem) for run in prefix_runs),
        files={**writer.files, **(prefix_writer.files if prefix_writer else {})},
    )


def _map_unit(
    unit: WorkUnit,
    task: MapTask,
    encoder: Encoder,
    writer: RunWriter,
    prefix_writer: RunWriter | None,
    problems: ProblemLog,
) -> MapStats:
    """Add the windows of one unit's documents to the runs; returns what was seen (the problems
    met go into ``problems``)."""
    seconds = EncodeSeconds()
    documents = tokens = ngrams = 0
    hashing = cpu_hashing = 0.0
    carry = None  # the last n-1 ids of a document piece that the next piece continues
    continuing = False
    for batch in encoded_batches(
        unit, task.options, problems, encoder, task.batch_documents, task.batch_bytes, seconds
    ):
        started, started_cpu = time.perf_counter(), time.thread_time()
        for document, ids in batch:
            documents += 0 if continuing else 1
            tokens += ids.size
            continuing = document.continues
        windows = batch_windows(
            [(ids, document.continues) for document, ids in batch],
            carry,
            task.ngram_size,
            task.hash_seed,
            encoder.special_ids,
            prefix_writer is not None or bool(task.index_token_bits),
        )
        ngrams += windows.fingerprints.size
        if task.index_token_bits:
            writer.add(window_index_keys(windows, task, unit))
        else:
            writer.add(windows.fingerprints)
        if prefix_writer is not None and windows.prefix_fingerprints is not None:
            prefix_writer.add(windows.prefix_fingerprints)
        carry = windows.carry
        hashing += time.perf_counter() - started
        cpu_hashing += time.thread_time() - started_cpu
    return MapStats(
        documents=documents,
        tokens=tokens,
        ngrams=ngrams,
        input_bytes=unit.size_bytes,
        seconds_reading=seconds.reading,
        seconds_tokenizing=seconds.encoding,
        seconds_hashing=hashing,
        cpu_seconds_hashing=cpu_hashing,
    )


def window_index_keys(windows: Windows, task: MapTask, unit: WorkUnit) -> np.ndarray:
    """The prefix-keyed index keys of a batch's stored windows (their prefixes' fingerprints
    above their last ids).

    Raises:
        BuildError: an id does not fit the index's token field (a pre-tokenized corpus holding
            ids beyond the tokenizer's vocabulary); storing it truncated would lose it.
    """
    last = windows.sequence[task.ngram_size - 1 :]
    if windows.clean is not None:
        last = last[windows.clean]
    last = last.astype(np.uint64)
    if task.index_next_words:
        last = last & np.uint64((1 << task.index_token_bits) - 1)
    elif last.size and int(last.max()) >> task.index_token_bits:
        raise BuildError(
            f"{unit.path}: holds token id {int(last.max())}, beyond the tokenizer's vocabulary "
            f"({task.index_token_bits}-bit ids); rebuild with the tokenizer these ids are of"
        )
    if windows.prefix_fingerprints is not None:
        prefixes = windows.prefix_fingerprints
    else:  # n = 1: every window's prefix is empty
        empty = fingerprints_np(np.zeros((1, 0), np.int64), task.hash_seed)[0]
        prefixes = np.full(last.size, empty)
    return index_keys(prefixes, last, task.index_token_bits)
