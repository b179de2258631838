"""Every header field the guard relies on is bound to the filter's contents, in every layout: an
edit of the tokenizer fingerprint, the special tokens or the normalizer (its plain checksum
recomputed, as any editor would) is refused, never opened as a filter that accepts any tokenizer
or exempts other ids (issue 34: deleting the fingerprint of a prefix index opened cleanly)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from memfree import NgramFilter
from memfree.errors import DamagedFilterError
from memfree.filterfile import open_filter
from memfree.filterfile.header import PREAMBLE
from memfree.filterfile.index.reader import IndexFilter
from memfree.filterfile.pybloom.reader import PybloomWriter, open_pybloom, sidecar_path

GUARDED = {
    "tokenizer": "test-tokenizer",
    "tokenizer_fingerprint": "0123456789abcdef",
    "special_token_ids": [0, 2],
}
NGRAMS = np.random.default_rng(7).integers(3, 300, size=(400, 4))

# (field, edit): None deletes the field.
EDITS = [
    ("tokenizer_fingerprint", None),
    ("tokenizer_fingerprint", "fedcba9876543210"),
    ("special_token_ids", [0, 2, 17]),
    ("special_token_ids", None),
    ("vocab_size", 301),
]


def rewrite_json(path: Path, field: str, value: Any) -> None:
    """Edit one metadata field of a native filter and recompute the JSON's own checksum."""
    data = bytearray(path.read_bytes())
    magic, version, length, _ = PREAMBLE.unpack_from(data)
    metadata = json.loads(data[PREAMBLE.size : PREAMBLE.size + length])
    if value is None:
        del metadata[field]
    else:
        metadata[field] = value
    raw = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
    data[PREAMBLE.size : PREAMBLE.size + length] = bytes(length)
    preamble = PREAMBLE.pack(magic, version, len(raw), xxhash.xxh3_64_intdigest(raw))
    data[: PREAMBLE.size + len(raw)] = preamble + raw
    path.write_bytes(bytes(data))


def native(layout: str, path: Path) -> Path:
    if layout == "prefix-index":
        IndexFilter.from_ngrams(path, NGRAMS, vocab_size=300, metadata=GUARDED).close()
    else:
        NgramFilter.from_ngrams(path, NGRAMS, metadata={**GUARDED, "vocab_size": 300}).close()
    return path


@pytest.mark.parametrize("layout", ["prefix-index", "blocked-512"])
@pytest.mark.parametrize(("field", "value"), EDITS)
def test_an_edited_guard_field_is_refused(
    tmp_path: Path, layout: str, field: str, value: Any
) -> None:
    path = native(layout, tmp_path / "f.memfree")
    assert open_filter(path).metadata["tokenizer_fingerprint"] == GUARDED["tokenizer_fingerprint"]
    rewrite_json(path, field, value)
    # vocab_size also sizes the index's stated rates, which are checked first
    expected = "guard relies on|uniform_false_positive_rate" if field == "vocab_size" else None
    with pytest.raises(DamagedFilterError, match=expected or "guard relies on"):
        open_filter(path)


@pytest.mark.parametrize("layout", ["prefix-index", "blocked-512"])
def test_an_edited_normalizer_is_refused(tmp_path: Path, layout: str) -> None:
    from memfree.vocab.words import ngram_hash_rows, word_metadata

    words = ["one", "two", "three", "four", "five", "six", "seven"]
    rows = ngram_hash_rows([words[i : i + 3] for i in range(5)])
    path = tmp_path / "w.memfree"
    if layout == "prefix-index":
        IndexFilter.from_word_ngrams(path, rows, metadata=word_metadata()).close()
    else:
        NgramFilter.from_ngrams(path, rows, metadata=word_metadata()).close()
    open_filter(path).close()
    rewrite_json(path, "normalizer", "another-normalizer-v9")
    with pytest.raises(DamagedFilterError, match="guard relies on"):
        open_filter(path)


def test_an_untouched_filter_still_opens(tmp_path: Path) -> None:
    """The check is not a refusal of everything: the same rewrite with the same value opens."""
    for layout in ("prefix-index", "blocked-512"):
        path = native(layout, tmp_path / f"{layout}.memfree")
        rewrite_json(path, "tokenizer_fingerprint", GUARDED["tokenizer_fingerprint"])
        assert open_filter(path).metadata["special_token_ids"] == [0, 2]


def test_an_edited_interchange_sidecar_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.bloom"
    writer = PybloomWriter(capacity=1000, error_rate=1e-3, hash_seed=5)
    writer.add_ngrams(NGRAMS)
    writer.write(path, {**GUARDED, "n": 4}, len(np.unique(NGRAMS, axis=0)))
    assert open_pybloom(path).metadata["tokenizer_fingerprint"] == GUARDED["tokenizer_fingerprint"]
    sidecar = json.loads(sidecar_path(path).read_text())
    del sidecar["tokenizer_fingerprint"]
    sidecar_path(path).write_text(json.dumps(sidecar))
    with pytest.raises(DamagedFilterError, match="guard relies on"):
        open_pybloom(path)
