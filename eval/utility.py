"""Utility impact (Ippolito et al. 2023, Appendix B.4, Table 1): how much ordinary text a filter
would block, i.e. what share of texts and n-grams a guarded model could no longer write."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from eval.records import StoredNgramExample, UtilityResult, signature_of
from memfree.units import unit_of


def run_utility(
    texts: Sequence[str], tokenizer: Any, ngram_filter: Any, max_examples: int = 5
) -> UtilityResult:
    """How much of ``texts`` the filter would block.

    Args:
        texts: reference texts (e.g. held-out documents the model should still be able to write).
        tokenizer: the filter's tokenizer (unused for a word filter, whose n-grams are those of
            the text's normalized words).
        ngram_filter: the filter.
        max_examples: texts with stored n-grams to quote.

    Returns:
        texts, texts holding a stored n-gram (count and share), n-grams and stored n-grams (count
        and share), examples, and the settings and signature behind them.
    """
    from tqdm import tqdm

    unit = unit_of(ngram_filter)
    texts_blocked = ngrams_total = ngrams_stored = 0
    examples: list[StoredNgramExample] = []
    for text in tqdm(texts, desc="utility", unit="text", file=sys.stderr, leave=False):
        found = unit.text_ngrams(ngram_filter, text, tokenizer)
        hits = int(found.stored.sum())
        ngrams_total += int(found.stored.shape[0])
        ngrams_stored += hits
        if not hits:
            continue
        texts_blocked += 1
        if len(examples) < max_examples:
            first = found.ngrams[int(np.flatnonzero(found.stored)[0])]
            examples.append(StoredNgramExample(text[:200], first, hits))
    header = ngram_filter.header
    settings = {
        "filter": str(ngram_filter.path),
        "filter_bits_xxh3": getattr(header, "bits_xxh3", None),  # the Bloom layout's
        "unit": ngram_filter.unit,
        "n": ngram_filter.n,
        "tokenizer_fingerprint": header.tokenizer_fingerprint,
        "max_examples": max_examples,
    }
    return UtilityResult(
        texts=len(texts),
        texts_with_stored_ngram=texts_blocked,
        ngrams=ngrams_total,
        stored_ngrams=ngrams_stored,
        examples=tuple(examples),
        settings=settings,
        signature=signature_of({k: v for k, v in settings.items() if k != "filter"}),
    )


__all__ = ["run_utility"]
