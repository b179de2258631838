"""The prefix-keyed index layout (``prefix-index-v1``, the default build): its face.

Everything outside this folder imports from here (``make lint`` holds it):

- :mod:`.layout`: the records (a fingerprint of each stored n-gram's (n-1)-prefix and its next
  token, sorted by prefix, packed in sections);
- :mod:`.sizing`: the widths that meet a target rate of false bans, and the rates a header
  states;
- :mod:`.header`: the file's header, its fields checked, its sections checked against it;
- :mod:`.checks`: the records checked block by block before their first read;
- :mod:`.query`: one lookup per row;
- :mod:`.reader`: :class:`IndexFilter`, the reader;
- :mod:`.writer`: writing a file section by section, from any process.
"""

from __future__ import annotations

from memfree.filterfile.index.header import IndexHeader
from memfree.filterfile.index.layout import (
    INDEX_LAYOUT,
    MAX_SECTION_RECORDS,
    IndexShape,
    encode_sections,
    index_keys,
    token_bits_for,
)
from memfree.filterfile.index.query import IndexArrays, contains_keys, lookup
from memfree.filterfile.index.reader import (
    DEFAULT_INDEX_FALSE_POSITIVE_RATE,
    IndexFilter,
    open_index,
    verify_written,
)
from memfree.filterfile.index.sizing import (
    CONCENTRATION_SAMPLE,
    Concentration,
    choose_shape,
    natural_rate,
    stated_rates,
    word_rate,
    word_shape,
    word_token_bits,
)
from memfree.filterfile.index.writer import IndexFileWriter, SectionTarget, WrittenSections

__all__ = [
    "CONCENTRATION_SAMPLE",
    "DEFAULT_INDEX_FALSE_POSITIVE_RATE",
    "INDEX_LAYOUT",
    "MAX_SECTION_RECORDS",
    "Concentration",
    "IndexArrays",
    "IndexFileWriter",
    "IndexFilter",
    "IndexHeader",
    "IndexShape",
    "SectionTarget",
    "WrittenSections",
    "choose_shape",
    "contains_keys",
    "encode_sections",
    "index_keys",
    "lookup",
    "natural_rate",
    "open_index",
    "stated_rates",
    "token_bits_for",
    "verify_written",
    "word_rate",
    "word_shape",
    "word_token_bits",
]
