"""Helpers for tests and small explicit sets: nothing in a decoding loop or a build uses them.

- :func:`word_filter_from_texts`: a word filter written straight from a few texts (corpora go
  through ``memfree build --unit word``, which gives the same filter for the same texts).
- :func:`token_filter_from_ngrams`: a token filter of a few explicit id n-grams, bound to a
  tokenizer (a guard made with that tokenizer accepts it).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable

import numpy as np

from memfree.filterfile import NgramFilter
from memfree.filterfile.hashing import DEFAULT_HASH_SEED
from memfree.filterfile.index import DEFAULT_INDEX_FALSE_POSITIVE_RATE, IndexFilter
from memfree.filterfile.protocol import NgramSet
from memfree.vocab.words import text_word_hashes, word_metadata


def word_filter_from_texts(
    path: str | os.PathLike[str],
    texts: Iterable[str],
    ngram_size: int,
    *,
    min_count: int = 1,
    false_positive_rate: float | None = None,
    hash_seed: int = DEFAULT_HASH_SEED,
    layout: str = "blocked-512",
) -> NgramSet:
    """Write a word filter of the word n-grams seen at least ``min_count`` times in ``texts``.

    For small, explicit sets (tests, block lists); corpora go through
    ``memfree build --unit word``, which gives the same filter for the same texts and settings.

    Args:
        layout: "blocked-512" (a Bloom filter; rate default 1e-3) or "prefix-index" (the
            prefix-keyed index; rate default 1e-5 per natural query).
    """
    counts: Counter[tuple[int, ...]] = Counter()
    for text in texts:
        hashes = text_word_hashes(text).tolist()
        counts.update(
            tuple(hashes[i : i + ngram_size]) for i in range(len(hashes) - ngram_size + 1)
        )
    kept = [ngram for ngram, count in counts.items() if count >= min_count]
    rows = np.array(kept, dtype=np.uint64).reshape(len(kept), ngram_size)
    metadata = {**word_metadata(), "min_count": min_count}
    if layout == "prefix-index":
        return IndexFilter.from_word_ngrams(
            path,
            rows,
            false_positive_rate=false_positive_rate or DEFAULT_INDEX_FALSE_POSITIVE_RATE,
            hash_seed=hash_seed,
            metadata=metadata,
        )
    if layout != "blocked-512":
        raise ValueError(f"layout must be 'prefix-index' or 'blocked-512', got {layout!r}")
    return NgramFilter.from_ngrams(
        path,
        rows,
        false_positive_rate=false_positive_rate or 1e-3,
        hash_seed=hash_seed,
        metadata=metadata,
    )


def token_filter_from_ngrams(
    path: str | os.PathLike[str],
    ngrams: Iterable[Iterable[int]],
    tokenizer: object,
    *,
    false_positive_rate: float = 1e-9,
) -> NgramFilter:
    """Write a Bloom filter of exactly ``ngrams`` (token ids), bound to ``tokenizer``'s
    fingerprint and special ids: for tests and benchmarks that need a filter that stores a
    chosen set (or nothing the model writes)."""
    from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint

    return NgramFilter.from_ngrams(
        path,
        [list(ngram) for ngram in ngrams],
        false_positive_rate=false_positive_rate,
        metadata={
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "special_token_ids": list(special_token_ids(tokenizer)),
        },
    )


__all__ = ["token_filter_from_ngrams", "word_filter_from_texts"]
