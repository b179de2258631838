"""Writing the kept n-grams as a pybloomfiltermmap3 file (interchange format).

That format hashes the n-gram's bytes, not memfree's 64-bit fingerprint, so the reduce stage's
output (fingerprints) is not enough: a second pass re-reads and re-tokenizes the corpus and inserts
every n-gram whose fingerprint was kept. It runs in this process; the native format needs no
second pass and is the one to use for large corpora.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bloom_builder.segments import split_long, take_batch
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit, read_unit
from bloom_builder.stages import BatchEncoder, ReduceTask, TokenizerPayload, read_kept
from memfree.hashing import sliding_fingerprints_np
from memfree.pybloom import PybloomWriter


def write_pybloom_filter(
    output: Path,
    shards: list[tuple[WorkUnit, ...]],
    reduce_tasks: list[ReduceTask],
    settings: BuildSettings,
    payload: TokenizerPayload,
    metadata: dict[str, Any],
    options: SourceOptions,
    batch_bytes: int,
) -> tuple[int, int, float]:
    """Write ``output`` (and its ``.json`` sidecar); returns (num_bits, num_hashes, expected FPR)."""
    parts = [np.asarray(read_kept(task)) for task in reduce_tasks]
    kept = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)  # sorted
    writer = PybloomWriter(max(int(kept.size), 1), settings.false_positive_rate, settings.hash_seed)
    encoder = payload.encoder()
    size = settings.ngram_size
    for shard in shards:
        for unit in shard:
            carry = np.empty(0, dtype=np.uint32)
            documents = split_long(read_unit(unit, options, ProblemLog()))
            while batch := take_batch(documents, settings.batch_documents, batch_bytes):
                carry = _insert(batch, encoder, carry, kept, writer, size, settings.hash_seed)
    metadata = {key: value for key, value in metadata.items() if key != "num_probes"}
    writer.write(output, metadata, int(kept.size))
    from memfree.pybloom import expected_false_positive_rate

    rate = expected_false_positive_rate(int(kept.size), writer.num_bits, writer.num_hashes)
    return writer.num_bits, writer.num_hashes, rate


def _has_special(windows: np.ndarray, encoder: BatchEncoder) -> np.ndarray:
    """Which windows hold a special token (those are never stored)."""
    if not encoder.special_ids.size:
        return np.zeros(windows.shape[0], dtype=bool)
    return np.asarray(np.isin(windows, encoder.special_ids).any(axis=1))


def _insert(
    batch: list[Any],
    encoder: BatchEncoder,
    carry: np.ndarray,
    kept: np.ndarray,
    writer: PybloomWriter,
    ngram_size: int,
    seed: int,
) -> np.ndarray:
    if not batch:
        return carry
    for document, ids in zip(batch, encoder.encode([d.text for d in batch]), strict=True):
        if carry.size:
            ids = np.concatenate((carry, ids))
        fingerprints = sliding_fingerprints_np(ids, ngram_size, seed)
        if fingerprints.size and kept.size:
            where = np.minimum(np.searchsorted(kept, fingerprints), kept.size - 1)
            windows = np.lib.stride_tricks.sliding_window_view(ids, ngram_size)
            selected = windows[(kept[where] == fingerprints) & ~_has_special(windows, encoder)]
            if selected.size:
                writer.add_ngrams(np.ascontiguousarray(selected))
        keep = ngram_size - 1 if document.continues else 0
        carry = ids[ids.size - keep :] if keep else ids[:0]
    return carry
