"""The word unit: text normalization, word hashes and word n-gram fingerprints.

A word filter stores n-grams of *normalized words*, so one filter serves every tokenizer and
matches text however it is cased, spaced or punctuated. The rule (``NORMALIZER``, recorded in the
filter header with the Unicode version of the ``unicodedata`` that applied it):

1. Unicode NFKC, then full case folding (``str.casefold``), of the whole text.
2. Words are the maximal runs of characters that are alphanumeric (``str.isalnum``: letters and
   numbers) or combining marks (general category M). Everything else separates words and
   vanishes: whitespace, punctuation, symbols, underscores, comment markers.

So ``"# float Q_sqrt( float NUMBER )"`` and ``"float q_sqrt(float number)"`` are both the words
``float q sqrt float number``. Bytes that are not UTF-8 read as U+FFFD, a separator.

A word's hash is the murmur3 finalizer of a little-endian polynomial over its UTF-8 bytes,
``sum(byte[i] * WORD_MULTIPLIER**i) mod 2**64``: the guard extends a partial word by a token's
bytes with one multiply-add. A word n-gram's fingerprint is the token unit's Horner fingerprint
(:mod:`memfree.filterfile.hashing`) over word hashes in place of token ids, so the filter file, its probes
and its prefix section are the token unit's.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from memfree.filterfile.hashing import (
    DEFAULT_HASH_SEED,
    MASK64,
    fmix64_np,
    fmix64_reference,
)
from memfree.filterfile.sliding import sliding_fingerprints_np

if TYPE_CHECKING:
    pass

NORMALIZER = "nfkc-casefold-alnum-marks-v1"
UNICODE_VERSION = unicodedata.unidata_version
WORD_MULTIPLIER = 0xD6E8FEB86659FD93  # odd: B**i is invertible and never 0 mod 2**64
WORD_OFFSET = 0x9E6C63D0676A9A99


@lru_cache(maxsize=1)
def _mark_class() -> str:
    """A regex character class body holding every combining mark (category M*) as ranges."""
    ranges: list[tuple[int, int]] = []
    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code))[0] == "M":
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))
    return "".join(
        re.escape(chr(low)) if low == high else f"{re.escape(chr(low))}-{re.escape(chr(high))}"
        for low, high in ranges
    )


@lru_cache(maxsize=1)
def word_pattern() -> re.Pattern[str]:
    """The compiled pattern of one word in normalized text."""
    return re.compile(f"(?:[^\\W_]|[{_mark_class()}])+")


def is_word_char(char: str) -> bool:
    """Whether a (normalized) character belongs to words."""
    return char.isalnum() or unicodedata.category(char)[0] == "M"


def normalize(text: str) -> str:
    """NFKC, then case folding: the text whose word runs are the words."""
    return unicodedata.normalize("NFKC", text).casefold()


def words(text: str) -> list[str]:
    """The normalized words of a text, in order.

    >>> words("# float Q_sqrt( float NUMBER )")
    ['float', 'q', 'sqrt', 'float', 'number']
    """
    return word_pattern().findall(normalize(text))


def word_ngrams(text: str, ngram_size: int) -> list[tuple[str, ...]]:
    """The word n-grams of a text, in order."""
    found = words(text)
    return [tuple(found[i : i + ngram_size]) for i in range(len(found) - ngram_size + 1)]


def new_word_ngrams(before: str, after: str, ngram_size: int) -> list[tuple[str, ...]]:
    """The word n-grams of ``after`` that ``before`` (a prefix of it) does not already end with.

    Those are the n-grams ending at a word that changed or was added when the text grew from
    ``before`` to ``after``: what a generation created, the prompt's own n-grams excluded.
    """
    return created_word_ngrams(words(before), words(after), ngram_size)


def created_word_ngrams(
    old: Sequence[str], new: Sequence[str], ngram_size: int
) -> list[tuple[str, ...]]:
    """The n-grams of the words ``new`` that end at a word past the common start with ``old``.

    A text that grew from words ``old`` to words ``new`` created exactly these (the word guard's
    exact path and :func:`new_word_ngrams` share this rule).
    """
    same = 0
    for a, b in zip(old, new, strict=False):
        if a != b:
            break
        same += 1
    first = max(same, ngram_size - 1)
    return [tuple(new[end - ngram_size + 1 : end + 1]) for end in range(first, len(new))]


# ------------------------------------------------------------------------------------------------
# Word hashes


def word_poly(data: bytes) -> int:
    """``sum(data[i] * WORD_MULTIPLIER**i) mod 2**64`` (Python integers)."""
    value, power = 0, 1
    for byte in data:
        value = (value + byte * power) & MASK64
        power = (power * WORD_MULTIPLIER) & MASK64
    return value


def finish_word(poly: int) -> int:
    """A word's hash from its polynomial."""
    return fmix64_reference(poly + WORD_OFFSET)


def word_hash(word: str) -> int:
    """The 64-bit hash of one normalized word (Python integers; the reference)."""
    return finish_word(word_poly(word.encode("utf-8")))


@lru_cache(maxsize=8)
def _powers(length: int) -> np.ndarray:
    """WORD_MULTIPLIER**i mod 2**64 for i in range(length), as uint64."""
    powers = np.full(max(length, 1), np.uint64(WORD_MULTIPLIER), dtype=np.uint64)
    powers[0] = np.uint64(1)
    with np.errstate(over="ignore"):
        return np.multiply.accumulate(powers, dtype=np.uint64)


def word_hashes_np(found: Sequence[str]) -> np.ndarray:
    """Hashes of many words at once; uint64 `(len(found),)`, equal to :func:`word_hash`."""
    if not found:
        return np.empty(0, dtype=np.uint64)
    encoded = [word.encode("utf-8") for word in found]
    lengths = np.fromiter((len(item) for item in encoded), dtype=np.int64, count=len(encoded))
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(np.uint64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    exponents = np.arange(data.shape[0]) - np.repeat(starts, lengths)
    powers = _powers(1 << max(int(lengths.max()) - 1, 0).bit_length())
    with np.errstate(over="ignore"):
        polys = np.add.reduceat(data * powers[exponents], starts, dtype=np.uint64)
        values = polys + np.uint64(WORD_OFFSET)
    return fmix64_np(values)


def text_word_hashes(text: str) -> np.ndarray:
    """Hashes of a text's normalized words, in order; uint64."""
    return word_hashes_np(words(text))


def word_ngram_fingerprints(
    found: Sequence[str] | np.ndarray, ngram_size: int, seed: int = DEFAULT_HASH_SEED
) -> np.ndarray:
    """Fingerprints of every word n-gram of a word sequence (words or their hashes), in order."""
    hashes = found if isinstance(found, np.ndarray) else word_hashes_np(list(found))
    return sliding_fingerprints_np(hashes, ngram_size, seed)


def ngram_hash_rows(ngrams: Iterable[Sequence[str]]) -> np.ndarray:
    """A `(N, n)` uint64 array of word hashes, for :meth:`NgramFilter.contains`."""
    rows = [list(ngram) for ngram in ngrams]
    if not rows:
        return np.empty((0, 0), dtype=np.uint64)
    flat = word_hashes_np([word for row in rows for word in row])
    return flat.reshape(len(rows), -1)


def word_metadata() -> dict[str, str]:
    """The header fields that make a filter a word filter."""
    return {"unit": "word", "normalizer": NORMALIZER, "unicode_version": UNICODE_VERSION}


# ------------------------------------------------------------------------------------------------
# Where normalization may be cut


@lru_cache(maxsize=1)
def _composition_seconds() -> frozenset[str]:
    """Characters that canonical composition can merge into the character before them."""
    seconds = set()
    for code in range(sys.maxunicode + 1):
        decomposition = unicodedata.decomposition(chr(code))
        if not decomposition or decomposition.startswith("<"):
            continue
        parts = decomposition.split()
        if len(parts) != 2:
            continue
        first, second = (chr(int(part, 16)) for part in parts)
        if unicodedata.normalize("NFC", first + second) == chr(code):
            seconds.add(second)
    seconds.update(chr(code) for code in range(0x1161, 0x1176))  # Hangul vowels (L+V -> LV)
    seconds.update(chr(code) for code in range(0x11A8, 0x11C3))  # Hangul finals (LV+T -> LVT)
    return frozenset(seconds)


def starts_clean(text: str) -> bool:
    """Whether normalization never reaches across the start of ``text``.

    True when the first character has no compatibility or canonical decomposition that starts
    with a non-starter, and cannot compose with a character before it. Then, for every ``a``,
    ``normalize(a + text) == normalize(a) + normalize(text)`` (checked over all of Unicode in the
    tests). An empty text is clean.
    """
    if not text:
        return True
    first = unicodedata.normalize("NFKD", text[0])[:1] or text[0]
    return unicodedata.combining(first) == 0 and first not in _composition_seconds()


__all__ = [
    "NORMALIZER",
    "UNICODE_VERSION",
    "created_word_ngrams",
    "finish_word",
    "is_word_char",
    "new_word_ngrams",
    "ngram_hash_rows",
    "normalize",
    "starts_clean",
    "text_word_hashes",
    "word_hash",
    "word_hashes_np",
    "word_metadata",
    "word_ngram_fingerprints",
    "word_ngrams",
    "word_pattern",
    "word_poly",
    "words",
]
