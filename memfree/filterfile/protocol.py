"""What every filter format answers when read (:class:`NgramSet`), and the bit arrays a format in
memfree's blocked layout hands to the guard core (:class:`BlockedBits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from memfree.filterfile.header import FilterHeader
    from memfree.filterfile.index import IndexArrays


@dataclass(frozen=True)
class BlockedBits:
    """A filter's bit arrays in memfree's blocked layout: what the guard core hashes into.

    A format that stores its n-grams this way (the native one) hands these to the guard, which
    then queries them on any device; one that does not (pybloomfiltermmap3) answers only
    :meth:`NgramSet.contains`.
    """

    bit_words: np.ndarray  # uint64 (num_blocks * 8,), memory-mapped: never write
    num_probes: int
    hash_seed: int
    prefix_bit_words: np.ndarray | None  # the (n-1)-prefix section, None when the file has none
    prefix_num_probes: int


@runtime_checkable
class NgramSet(Protocol):
    """What every filter format answers when read: the guard and the evaluation need no more.

    Every layout's reader implements it, each a subclass of the face
    :class:`~memfree.filterfile.NgramFilter`: :class:`~memfree.filterfile.bloom.reader.BloomFilter`
    (memfree's Bloom layout), :class:`~memfree.filterfile.index.reader.IndexFilter` (the
    prefix-keyed index) and :class:`~memfree.filterfile.pybloom.reader.PybloomNgramFilter`
    (pybloomfiltermmap3 interchange files).
    """

    path: Path
    header: FilterHeader  # the header, parsed once at open and read by attribute

    @property
    def n(self) -> int: ...
    @property
    def unit(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def metadata(self) -> dict[str, Any]: ...
    @property
    def special_token_ids(self) -> tuple[int, ...] | None: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def expected_false_positive_rate(self) -> float: ...
    def contains(self, ngrams: np.ndarray | list[list[int]]) -> np.ndarray: ...
    def blocked_bits(self) -> BlockedBits | None: ...
    def prefix_index(self) -> IndexArrays | None: ...
    def __len__(self) -> int: ...
    def close(self) -> None: ...


__all__ = ["BlockedBits", "NgramSet"]
