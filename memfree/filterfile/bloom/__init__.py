"""memfree's blocked Bloom layout (``blocked-512``): its face.

Everything outside this folder imports from here (``make lint`` holds it):

- :mod:`.reader`: :class:`BloomFilter`, the validated, memory-mapped reader;
- :mod:`.opening`: header, bits and file watch taken from one open file and verified;
- :mod:`.writer`: the blocked bit arrays, the header that records what produced them, and one
  file written whole.

The header both layouts share (the preamble, the metadata's checks) is
:mod:`memfree.filterfile.header`; the hashing is :mod:`memfree.filterfile.hashing`.
"""

from __future__ import annotations

from memfree.filterfile.bloom.header import BloomHeader
from memfree.filterfile.bloom.reader import BloomFilter, describe_rate
from memfree.filterfile.bloom.writer import (
    FilterFileWriter,
    PrefixSection,
    bits_from_fingerprints,
    set_fingerprint_bits,
    write_filter,
    write_ngrams,
)

__all__ = [
    "BloomFilter",
    "BloomHeader",
    "FilterFileWriter",
    "PrefixSection",
    "bits_from_fingerprints",
    "describe_rate",
    "set_fingerprint_bits",
    "write_filter",
    "write_ngrams",
]
