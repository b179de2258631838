"""Sizing the prefix-keyed index (:mod:`memfree.filterfile.index.layout`) and the rates its header
states: the widths that meet a target rate of false bans per natural query in the fewest bytes.

A false ban needs a prefix collision (another stored prefix with the row's bucket and remainder),
and then the query's token among that prefix's stored tokens. Those tokens are the corpus's common
ones, and so is the token a model is about to write: the builder measures how concentrated the
stored next tokens are (:class:`Concentration`) and sizes the remainder for it (issue 34: sized as
if tokens were drawn uniformly, an index stating 5e-6 met 2e-3 on real code). The Bloom layout's
sizing is :mod:`memfree.filterfile.sizing`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from memfree.filterfile.index.layout import (
    BLOCK_BITS,
    BUCKET_TARGET,
    MAX_RECORD_BITS,
    MAX_SECTION_BITS,
    IndexShape,
)


def word_token_bits(rate: float) -> int:
    """Bits of a next word's hash that a word index keeps (its "token" field): enough that a
    candidate word after a stored prefix matches one of its stored next words with probability
    at most about ``rate / 2`` per stored next word (8 to 40 bits)."""
    return min(40, max(8, math.ceil(math.log2(2.0 / float(rate)))))


#: Records whose next-token field is counted to measure how concentrated the stored next tokens
#: are: the first this many keys in key order, a random sample of prefixes (keys are sorted by
#: their prefix's fingerprint), the same for any partitioning of the build.
CONCENTRATION_SAMPLE = 1 << 20


@dataclass(frozen=True)
class Concentration:
    """How concentrated the stored next tokens are: the chance that two stored n-grams drawn at
    random end with the same token (the sum of squared token shares, from a sample).

    A natural query's next token is common (a newline, a space, a parenthesis) and so are the
    stored n-grams' next tokens: when a query's prefix collides with a stored prefix, its token
    is one of that prefix's stored tokens with about this probability, not ``1 / vocabulary``.
    The index's rate is sized and stated with it (Ippolito et al.'s guard bans what a colliding
    prefix stores, so this is what a guarded model meets).

    Attributes:
        sample: records counted (the first :data:`CONCENTRATION_SAMPLE` keys, or all).
        squares: the sum over next-token values of their count in the sample, squared.
    """

    sample: int
    squares: int

    @classmethod
    def of_keys(cls, sorted_keys: np.ndarray, token_bits: int) -> Concentration:
        """The concentration of the first :data:`CONCENTRATION_SAMPLE` of ``sorted_keys``."""
        head = np.asarray(sorted_keys[:CONCENTRATION_SAMPLE], dtype=np.uint64)
        fields = head & np.uint64((1 << token_bits) - 1)
        _, counts = np.unique(fields, return_counts=True)
        return cls(int(head.size), int(np.square(counts.astype(np.int64)).sum()))

    @property
    def value(self) -> float:
        """The sum of squared shares, in [1 / sample, 1] (1 for an empty sample)."""
        return self.squares / self.sample**2 if self.sample else 1.0

    def problem(self, num_records: int) -> str | None:
        """Why these counts cannot come from ``num_records`` records, or None."""
        if self.sample != min(num_records, CONCENTRATION_SAMPLE):
            return (
                f"concentration_sample is {self.sample}, expected "
                f"min(num_ngrams, {CONCENTRATION_SAMPLE}) = {min(num_records, CONCENTRATION_SAMPLE)}"
            )
        if not self.sample <= self.squares <= self.sample**2:
            return f"concentration_squares {self.squares} is not in [sample, sample**2]"
        return None


def word_shape(num_records: int, rate: float, concentration: float) -> IndexShape:
    """The widths of a word index of ``num_records`` records for a target ``rate`` of false bans
    per natural query: half of it for the next-word field (a stored prefix's own next words
    match another word 1 time in ``2**t``), half for the prefix remainder (another prefix's
    stored next words, met when the row's prefix shares its bucket and remainder; a natural next
    word is one of them with probability ``concentration``)."""
    bits = word_token_bits(rate)
    return choose_shape(num_records, bits, float(rate) / 2, concentration)


def word_rate(num_records: int, shape: IndexShape, concentration: float) -> float:
    """Expected false bans of a natural query of a word index (:func:`word_shape`'s two halves):
    a prefix collision, or a chance match of its next word's field."""
    return natural_rate(num_records, shape, concentration) + 2.0**-shape.token_bits


def choose_shape(
    num_records: int, token_bits: int, rate: float, concentration: float
) -> IndexShape:
    """The widths for ``num_records`` records that meet ``rate`` false bans per natural query
    (:func:`natural_rate`, for any row, its prefix stored or not) in the fewest bytes: of the
    bucket widths that give 8 to 32 records a bucket (around :data:`BUCKET_TARGET`), each with
    the fewest remainder bits that meet the rate, the one whose records and directory are
    smallest. (A remainder bit is a whole bit per record; a bucket bit costs a directory entry
    per bucket: which wins depends on where the rate falls between two remainder widths.)

    Args:
        num_records: stored n-grams.
        token_bits: t, the width of the token field.
        rate: the target false bans per natural query.
        concentration: :attr:`Concentration.value` of the stored next tokens.
    """
    if not num_records:
        return IndexShape(token_bits, 0, 0, 0, 0)
    wanted = round(math.log2(num_records / BUCKET_TARGET))
    best: tuple[bool, int, IndexShape] | None = None
    for candidate in (wanted, wanted - 1, wanted + 1):  # ties keep about 16 a bucket
        bucket_bits = min(max(0, candidate), MAX_SECTION_BITS + 31, 64 - token_bits)
        room = min(64 - token_bits - bucket_bits, MAX_RECORD_BITS - token_bits)
        # A row whose prefix is stored meets its bucket's other records: one more than a random
        # row's bucket holds on average (size-biased), so the rate is met for both.
        per_bucket = num_records / 2**bucket_bits + 1
        remainder = max(0, math.ceil(math.log2(per_bucket * concentration / rate)))
        section_bits = min(bucket_bits, MAX_SECTION_BITS)
        block_bits = min(bucket_bits - section_bits, BLOCK_BITS)
        shape = IndexShape(token_bits, bucket_bits, section_bits, min(remainder, room), block_bits)
        size_bits = shape.record_bits * num_records + 32 * shape.directory_entries
        # A width that cannot reach the rate (its remainder capped by the 64-bit key) loses.
        candidate_key = (remainder > room, size_bits, shape)
        if best is None or candidate_key[:2] < best[:2]:
            best = candidate_key
    assert best is not None  # three candidates
    return best[2]


def prefix_collision_rate(num_records: int, shape: IndexShape) -> float:
    """Expected records of another prefix that a row whose prefix is stored meets with its own
    remainder: a bound on the false bans of any one query, whatever its next token."""
    if not num_records:
        return 0.0
    per_bucket = num_records / 2**shape.bucket_bits + 1
    return min(1.0, per_bucket / 2**shape.remainder_bits)


def natural_rate(num_records: int, shape: IndexShape, concentration: float) -> float:
    """Expected false bans of a natural query (a prefix and the token that follows it in text
    like the corpus): a prefix collision, and the query's token among the colliding prefix's
    stored tokens (``concentration``, :class:`Concentration`)."""
    return min(1.0, prefix_collision_rate(num_records, shape) * concentration)


def uniform_rate(num_records: int, shape: IndexShape, vocab_size: int) -> float:
    """Expected share of a row's candidates banned falsely when every candidate of the
    vocabulary is asked: a bucket's records whose remainder matches by chance, spread over it."""
    return prefix_collision_rate(num_records, shape) / max(vocab_size, 1)


def stated_rates(
    num_records: int, shape: IndexShape, vocab_size: int, concentration: float, unit: str
) -> dict[str, float]:
    """The rates an index header states (each recomputed and checked when it is opened).

    ``expected_false_positive_rate`` is per natural query (:func:`natural_rate`; a word index's
    adds the next-word field's chance matches, :func:`word_rate`), the figure ``--fpr`` sizes;
    ``uniform_false_positive_rate`` per candidate token of a row that asks the whole vocabulary;
    ``prefix_collision_rate`` bounds any query whatever its token.
    """
    natural = natural_rate(num_records, shape, concentration)
    uniform = uniform_rate(num_records, shape, vocab_size)
    if unit == "word" and num_records:
        natural, uniform = natural + 2.0**-shape.token_bits, uniform + 2.0**-shape.token_bits
    return {
        "expected_false_positive_rate": natural,
        "uniform_false_positive_rate": uniform,
        "prefix_collision_rate": prefix_collision_rate(num_records, shape),
    }


__all__ = [
    "CONCENTRATION_SAMPLE",
    "Concentration",
    "choose_shape",
    "natural_rate",
    "prefix_collision_rate",
    "stated_rates",
    "uniform_rate",
    "word_rate",
    "word_shape",
    "word_token_bits",
]
