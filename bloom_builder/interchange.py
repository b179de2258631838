"""The pybloomfiltermmap3 writer (interchange format): a second pass over the corpus that inserts
the windows the native format stores, where their fingerprint was kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bloom_builder.encode import Encoder, EncoderPayload, encoded_batches
from bloom_builder.reduce import ReduceTask, read_kept
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit
from bloom_builder.windows import fingerprint_windows
from memfree.filterfile.pybloom import PybloomWriter


def write_pybloom_filter(
    output: Path,
    shards: list[tuple[WorkUnit, ...]],
    reduce_tasks: list[ReduceTask],
    settings: BuildSettings,
    payload: EncoderPayload,
    metadata: dict[str, Any],
    options: SourceOptions,
    batch_bytes: int,
) -> tuple[int, int, float]:
    """Write ``output`` (and its ``.json`` sidecar); returns (num_bits, num_hashes, expected FPR).

    That format hashes the n-gram's bytes, not memfree's 64-bit fingerprint, so the reduce
    step's output (fingerprints) is not enough: the corpus is read and encoded again, and every
    window :func:`~bloom_builder.windows.fingerprint_windows` keeps (the same windows as the
    native format) whose fingerprint was kept is inserted. It runs in this process; the native
    format needs no second pass and is the one to use for large corpora.

    Args:
        output: the filter path.
        shards: the map step's shards, in order (their units are read again).
        reduce_tasks: the finished n-gram reduce tasks (their kept fingerprints).
        settings: the build's settings (n, seed, target rate, batch size).
        payload: the encoder recipe the map step used.
        metadata: the header fields to record (``num_probes`` is the native format's; dropped).
        options: how the units are read.
        batch_bytes: most characters encoded at once.
    """
    from memfree.filterfile.pybloom import expected_false_positive_rate

    parts = [np.asarray(read_kept(task)) for task in reduce_tasks]
    kept = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)  # sorted
    writer = PybloomWriter(max(int(kept.size), 1), settings.target_rate, settings.hash_seed)
    encoder = payload.encoder()
    for shard in shards:
        for unit in shard:
            _insert_unit(unit, options, encoder, kept, writer, settings, batch_bytes)
    metadata = {key: value for key, value in metadata.items() if key != "num_probes"}
    writer.write(output, metadata, int(kept.size))
    rate = expected_false_positive_rate(int(kept.size), writer.num_bits, writer.num_hashes)
    return writer.num_bits, writer.num_hashes, rate


def _insert_unit(
    unit: WorkUnit,
    options: SourceOptions,
    encoder: Encoder,
    kept: np.ndarray,
    writer: PybloomWriter,
    settings: BuildSettings,
    batch_bytes: int,
) -> None:
    """Insert the kept windows of one unit's documents (problems were reported by the map)."""
    size, carry = settings.ngram_size, None
    batches = encoded_batches(
        unit, options, ProblemLog(), encoder, settings.batch_documents, batch_bytes
    )
    for batch in batches:
        for document, ids in batch:
            windows = fingerprint_windows(
                ids, carry, document.continues, size, settings.hash_seed, encoder.special_ids
            )
            carry = windows.carry
            found = windows.fingerprints
            if found.size and kept.size:
                where = np.minimum(np.searchsorted(kept, found), kept.size - 1)
                selected = windows.ngrams(size)[kept[where] == found]
                if selected.size:
                    writer.add_ngrams(np.ascontiguousarray(selected))
