"""Writing a pybloomfiltermmap3 0.6 file of token n-grams and its ``.json`` sidecar, sized as the
library sizes ``BloomFilter(capacity, error_rate)``, with seeds derived so that the same inputs
give the same bytes (the reader is :mod:`memfree.filterfile.pybloom.reader`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from memfree.fileio import atomic_write
from memfree.filterfile.pybloom.arithmetic import (
    MAX_HASHES,
    derive_seeds,
    expected_false_positive_rate,
    library_size,
    ngram_key_bytes,
    probe_positions,
)
from memfree.filterfile.pybloom.layout import (
    BF_VERSION,
    BLOOM_STRUCT,
    FILE_PREFIX,
    HEADER_BYTES,
    KEY_ENCODING,
    MAGIC,
    PREAMBLE_BYTES,
    fields_digest,
    parse_header,
    sidecar_path,
    xxh3_hex,
)


class PybloomWriter:
    """Builds a pybloomfiltermmap3 file of token n-grams, sized as ``BloomFilter(capacity, p)``.

    Seeds derive from ``hash_seed`` (the library's are random): the same inputs give the same bytes.

    Args:
        capacity: n-grams the filter is sized for (the library's ``capacity``).
        error_rate: target false-positive rate at capacity, in (0, 1).
        hash_seed: 64-bit seed from which the ``num_hashes`` distinct 32-bit probe seeds derive.

    Example:
        >>> writer = PybloomWriter(capacity=1000, error_rate=0.01, hash_seed=7)
        >>> writer.add_ngrams(np.array([[1, 2, 3], [2, 3, 4]]))
        >>> writer.write("ngrams.bloom", {"unit": "token"}, num_ngrams=2)  # doctest: +SKIP
    """

    def __init__(self, capacity: int, error_rate: float, hash_seed: int) -> None:
        if not isinstance(capacity, int) or not 0 <= capacity < 1 << 64:
            raise ValueError(f"capacity must be an integer in [0, 2**64), got {capacity!r}")
        if not 0.0 < error_rate < 1.0:
            raise ValueError(f"error_rate must be in (0, 1), got {error_rate!r}")
        if not isinstance(hash_seed, int) or not 0 <= hash_seed < 1 << 64:
            raise ValueError(f"hash_seed must be an integer in [0, 2**64), got {hash_seed!r}")
        self.capacity, self.error_rate, self.hash_seed = capacity, float(error_rate), hash_seed
        self.num_hashes, self.num_bits = library_size(capacity, self.error_rate)
        self.seeds: list[int] = derive_seeds(hash_seed, self.num_hashes)
        self.bits = np.zeros(self.num_bits // 8, dtype=np.uint8)
        self.n: int | None = None

    def add_ngrams(self, ngrams: np.ndarray, chunk: int = 1 << 18) -> None:
        """Set the probe bits of each n-gram (integer array `(N, n)`, the same n in every call)."""
        array = np.asarray(ngrams)
        if array.ndim != 2 or array.shape[1] < 1 or self.n not in (None, array.shape[1]):
            raise ValueError(f"ngrams must have shape (N, {self.n or 'n'}), got {array.shape}")
        self.n = int(array.shape[1])
        for begin in range(0, array.shape[0], chunk):
            keys = ngram_key_bytes(array[begin : begin + chunk])
            positions = probe_positions(keys, self.seeds, self.num_bits).ravel()
            masks = np.left_shift(1, positions & 7).astype(np.uint8)
            np.bitwise_or.at(self.bits, positions >> 3, masks)

    def write(
        self, path: str | os.PathLike[str], metadata: dict[str, Any], num_ngrams: int
    ) -> Path:
        """Write the library's file format and the ``<path>.json`` sidecar, each atomically.

        Args:
            path: output file.
            metadata: JSON-serializable fields to keep (tokenizer name and fingerprint, corpus
                summary, ...); may give ``n`` when no n-gram was added.
            num_ngrams: distinct n-grams added; the library reports it as ``len()``.

        Returns:
            The path of the filter file.
        """
        path = Path(path)
        ngram_size = metadata.get("n", self.n)
        if not isinstance(ngram_size, int) or ngram_size < 1 or self.n not in (None, ngram_size):
            raise ValueError(
                f"n is unknown or inconsistent: added {self.n}, metadata {ngram_size!r}"
            )
        if not isinstance(num_ngrams, int) or num_ngrams < 0:
            raise ValueError(f"num_ngrams must be a non-negative integer, got {num_ngrams!r}")
        slots = self.seeds + [0] * (MAX_HASHES - self.num_hashes)
        header = BLOOM_STRUCT.pack(
            self.capacity, self.error_rate, self.num_hashes, *slots, bytes(4), bytes(8),
            BF_VERSION, 1, bytes(6), num_ngrams, bytes(128),
        )  # fmt: skip
        preamble = FILE_PREFIX.pack(MAGIC, self.num_bits, HEADER_BYTES) + header
        preamble += bytes(PREAMBLE_BYTES - len(preamble))
        problem, fields = parse_header(preamble, PREAMBLE_BYTES + len(self.bits))
        if problem:  # e.g. a capacity beyond uint64
            raise ValueError(f"cannot write {path}: {problem}")
        full = {
            **metadata,
            **fields,
            "n": ngram_size,
            "key_encoding": KEY_ENCODING,
            "key_bytes": 4 * ngram_size,
            "num_ngrams": num_ngrams,
            "hash_seed": self.hash_seed,
            "bits_xxh3": xxh3_hex(self.bits),
            "header_xxh3": xxh3_hex(preamble),
            "expected_false_positive_rate": expected_false_positive_rate(
                num_ngrams, self.num_bits, self.num_hashes
            ),
        }
        full["fields_xxh3"] = fields_digest(full)
        try:
            sidecar = json.dumps(full, sort_keys=True, indent=1, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as error:
            raise TypeError(f"metadata must be JSON-serializable ({error})") from None
        atomic_write(path, [preamble, self.bits.data])
        atomic_write(sidecar_path(path), [sidecar])
        return path


__all__ = ["PybloomWriter"]
