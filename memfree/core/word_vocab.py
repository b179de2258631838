"""The word masker's per-vocabulary table: what each token adds to a text, classified once.

A token either adds no text, starts with a word character (it extends the row's partial last word)
or starts with a separator; its later words are hashed once, with the Horner sums the masker needs
to extend a row's state by them (see :mod:`memfree.core.word`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from memfree.filterfile.hashing import horner_state_reference
from memfree.vocab.words import (
    is_word_char,
    normalize,
    starts_clean,
    word_hash,
    word_pattern,
    word_poly,
)

NONE, LEAD, SEPARATOR = 0, 1, 2  # WordVocab.kind: adds no text, word character first, separator


@dataclass
class WordVocab:
    """What each token adds to text, precomputed once per vocabulary and n.

    ``kind``: 0 adds no text, 1 starts with a word character (extends the partial word),
    2 starts with a separator. ``fast``: the token starts clean (normalization never reaches
    back across it); ``fast_after_pending``: also clean after an unfinished UTF-8 character
    (its first byte is not a continuation byte). ``later[j]`` (j = 1..n-1) lists the tokens that
    carry at least j words after their first separator, with ``prefix_part[j]`` the Horner sum of
    their first j-1 such words and ``last_word[j]`` the hash of word j.
    """

    data: list[bytes]
    kind: np.ndarray
    fast: np.ndarray
    fast_after_pending: np.ndarray
    lead_poly: np.ndarray
    later: dict[int, np.ndarray]
    prefix_part: dict[int, np.ndarray]
    last_word: dict[int, np.ndarray]
    inner_ngrams: dict[int, list[list[int]]]  # token -> its own word n-grams (hashes)
    later_by_kind: dict[tuple[int, int], np.ndarray]  # (kind, j) -> later[j] of that kind
    # Tokens that share a word share a lookup (" foo", "(foo" and ".foo" add the word "foo"):
    # the distinct first words of the separator-first tokens and the distinct leading pieces of
    # the word-first ones, with each token's index among them.
    sep_words: np.ndarray
    sep_inverse: np.ndarray
    lead_tokens: np.ndarray
    lead_keys: np.ndarray  # distinct lead_poly values (the merged word depends on nothing else)
    lead_inverse: np.ndarray

    @classmethod
    def build(cls, table: Sequence[bytes | None], ngram_size: int) -> WordVocab:
        size = len(table)
        kind = np.zeros(size, dtype=np.int8)
        fast = np.zeros(size, dtype=bool)
        after_pending = np.zeros(size, dtype=bool)
        lead_poly = np.zeros(size, dtype=np.uint64)
        later_ids: dict[int, list[int]] = {j: [] for j in range(1, ngram_size)}
        prefix_part: dict[int, list[int]] = {j: [] for j in range(1, ngram_size)}
        last_word: dict[int, list[int]] = {j: [] for j in range(1, ngram_size)}
        inner: dict[int, list[list[int]]] = {}
        data = [item or b"" for item in table]
        pattern = word_pattern()
        for token, raw in enumerate(data):
            if not raw:
                continue
            text = raw.decode("utf-8", "replace")
            norm = normalize(text)
            if not norm:
                continue
            clean = starts_clean(text)
            fast[token] = clean
            after_pending[token] = clean and not 0x80 <= raw[0] < 0xC0
            rest = norm
            if is_word_char(norm[0]):
                kind[token] = LEAD
                lead = pattern.match(norm)
                assert lead is not None
                encoded = lead.group().encode("utf-8")
                lead_poly[token] = word_poly(encoded)
                rest = norm[lead.end() :]
            else:
                kind[token] = SEPARATOR
            hashes = [cached_word_hash(word) for word in pattern.findall(rest)]
            for j, value in enumerate(hashes[: ngram_size - 1], start=1):
                later_ids[j].append(token)
                # The Horner sum of the words before word j, from 0: the row's state times
                # HORNER_MULTIPLIER**(j-1) plus this is the state after those words.
                prefix_part[j].append(horner_state_reference(hashes[: j - 1], seed=0))
                last_word[j].append(value)
            if len(hashes) >= ngram_size:
                inner[token] = [
                    hashes[i : i + ngram_size] for i in range(len(hashes) - ngram_size + 1)
                ]
        later = {j: np.asarray(v, dtype=np.int64) for j, v in later_ids.items()}
        by_kind = {
            (which, j): tokens[kind[tokens] == which]
            for j, tokens in later.items()
            for which in (LEAD, SEPARATOR)
        }
        separators = by_kind[SEPARATOR, 1] if ngram_size > 1 else np.zeros(0, dtype=np.int64)
        first_words = (
            np.asarray(last_word[1], dtype=np.uint64)[np.searchsorted(later[1], separators)]
            if ngram_size > 1
            else np.zeros(0, dtype=np.uint64)
        )
        sep_words, sep_inverse = np.unique(first_words, return_inverse=True)
        lead_tokens = np.flatnonzero(kind == LEAD)
        lead_keys, lead_inverse = np.unique(lead_poly[lead_tokens], return_inverse=True)
        return cls(
            sep_words=sep_words,
            sep_inverse=sep_inverse.reshape(-1),
            lead_tokens=lead_tokens,
            lead_keys=lead_keys,
            lead_inverse=lead_inverse.reshape(-1),
            later_by_kind=by_kind,
            data=data,
            kind=kind,
            fast=fast,
            fast_after_pending=after_pending,
            lead_poly=lead_poly,
            later=later,
            prefix_part={j: np.asarray(v, dtype=np.uint64) for j, v in prefix_part.items()},
            last_word={j: np.asarray(v, dtype=np.uint64) for j, v in last_word.items()},
            inner_ngrams=inner,
        )


@lru_cache(maxsize=1 << 16)
def cached_word_hash(word: str) -> int:
    """:func:`~memfree.vocab.words.word_hash`, cached: vocabularies and rows repeat their words."""
    return word_hash(word)


__all__ = ["LEAD", "NONE", "SEPARATOR", "WordVocab", "cached_word_hash"]
