"""The word masker's fast path over a word index (the prefix-keyed layout, ``unit`` "word").

A word index keeps, per stored word n-gram, its (n-1)-word prefix's fingerprint and the low t bits
of its last word's hash (:mod:`memfree.filterfile.index.layout`). The fast path's candidates come
in groups that share their first n-1 words (every separator-first token after a row's history;
every word-first token after the words before the row's partial word): such a group costs one
lookup of its prefix, which returns the few stored next words, and a comparison of the group's
words against them. Candidates that carry two words or more each have their own prefix and are
looked up key by key. The answers are those of
:meth:`~memfree.filterfile.index.reader.IndexFilter.contains`, candidate for candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memfree.core.word_fast import Lookup, horner_powers
from memfree.filterfile.hashing import fmix64_np, horner_state_reference
from memfree.filterfile.index import IndexArrays, contains_keys, lookup


@dataclass(frozen=True)
class WordIndex:
    """The filter's side of the word masker's fast path for a word index.

    Attributes:
        powers: ``HORNER_MULTIPLIER**k mod 2**64`` for k in 0..n.
    """

    n: int
    index: IndexArrays
    powers: tuple[int, ...]

    @classmethod
    def of(cls, ngram_size: int, index: IndexArrays) -> WordIndex:
        return cls(ngram_size, index, horner_powers(ngram_size))

    @property
    def hash_seed(self) -> int:
        return self.index.hash_seed

    def state_of(self, hashes: Sequence[int]) -> int:
        """The Horner state of a run of word hashes (before the finalizer)."""
        return horner_state_reference(list(hashes), self.hash_seed)

    def prefix_found(self, fingerprints: np.ndarray) -> np.ndarray:
        """Whether each (n-1)-word prefix fingerprint begins a stored n-gram (or shares its
        bucket and remainder with one that does); bool `(N,)`. Each distinct prefix's bucket
        is read once."""
        distinct, which = np.unique(np.asarray(fingerprints, dtype=np.uint64), return_inverse=True)
        rows, _ = lookup(self.index, distinct)
        found = np.zeros(distinct.shape[0], dtype=bool)
        found[rows] = True
        return found[which.reshape(-1)]

    def answer(self, lookups: Sequence[Lookup]) -> np.ndarray:
        """Whether each lookup's n-grams are stored, concatenated; bool."""
        low = np.uint64((1 << self.index.shape.token_bits) - 1)
        answers: list[np.ndarray | None] = [None] * len(lookups)
        grouped = [i for i, item in enumerate(lookups) if item.base.shape[0] == 1]
        if grouped:
            bases = np.concatenate([lookups[i].base for i in grouped])
            rows, nexts = lookup(self.index, fmix64_np(bases))
            nexts = nexts.astype(np.uint64)
            for position, i in enumerate(grouped):
                stored = nexts[rows == position]
                words = lookups[i].words
                answers[i] = (
                    np.isin(words & low, stored)
                    if stored.size
                    else np.zeros(words.shape[0], dtype=bool)
                )
        single = [i for i, item in enumerate(lookups) if item.base.shape[0] != 1]
        if single:
            bases = np.concatenate([lookups[i].base for i in single])
            words = np.concatenate([lookups[i].words for i in single])
            found = contains_keys(self.index, fmix64_np(bases), words)
            sizes = [lookups[i].words.shape[0] for i in single]
            for i, part in zip(single, np.split(found, np.cumsum(sizes)[:-1]), strict=True):
                answers[i] = part
        return np.concatenate([answer for answer in answers if answer is not None])


__all__ = ["WordIndex"]
