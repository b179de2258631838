"""The filter bits for a fixed corpus, pinned: a refactoring must not move a single bit.

Token and word unit, native and pybloomfiltermmap3 format, one worker and two; the expected
checksums were recorded on main before the code was reshaped (issue 13). A change of hash
scheme, tokenization cut, window rule or sizing moves them; such a change needs a new format
version, not a silent drift.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from memfree import NgramFilter

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "return",
    "self",
    "def",
    "class",
    "import",
    "for",
    "in",
    "range",
    "print",
    "total",
]


def _corpus(directory: Path) -> Path:
    """Text, JSONL and gzip files; a special token inside a document; a repeated passage."""
    rng = np.random.default_rng(1234)
    directory.mkdir(parents=True)
    for index in range(6):
        text = " ".join(rng.choice(WORDS, size=300)) + "\n"
        if index == 2:
            text += "def add(a, b):\n    return a + b\n<|endoftext|>class Stack:\n"
        (directory / f"doc{index}.txt").write_text(text * (1 + index % 2), encoding="utf-8")
    lines = [json.dumps({"text": " ".join(rng.choice(WORDS, size=80))}) for _ in range(5)]
    (directory / "rows.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(directory / "packed.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("The quick brown fox jumps over the lazy dog.\n" * 4)
    return directory


# (unit, format, min_count) -> (bits_xxh3, prefix bits_xxh3 or None, num_ngrams, num_bits)
PINNED: dict[tuple[str, str, int], tuple[str, str | None, int, int]] = {
    ("token", "memfree", 1): ("52a2aff648b12289", "7f25f2b2753ff08e", 522, 8192),
    ("token", "memfree", 2): ("028ca00f2d377130", "e7aafd9a07175e1f", 462, 7168),
    ("token", "pybloomfiltermmap3", 1): ("2773f1966c4805e3", None, 522, 7512),
    ("token", "pybloomfiltermmap3", 2): ("a1d61a142f8cce79", None, 462, 6656),
    ("word", "memfree", 1): ("97b20d45f26edbde", "ae13bdff2002e090", 1536, 24064),
    ("word", "memfree", 2): ("808bf4ea09be3097", "f6d44284dc42311d", 964, 15360),
}


def _build(
    tmp_path: Path, tokenizer_dir: Path, unit: str, fmt: str, min_count: int, workers: int
) -> Any:
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        _corpus(corpus)
    output = tmp_path / f"{unit}-{min_count}-{workers}.{'bloom' if fmt != 'memfree' else 'memfree'}"
    settings = BuildSettings(
        ngram_size=4 if unit == "token" else 3,
        unit=unit,
        tokenizer=str(tokenizer_dir) if unit == "token" else None,
        min_count=min_count,
        output_format=fmt,
        layout="blocked-512" if fmt == "memfree" else None,
        workers=workers,
        shard_bytes=3000,
    )
    build_filter([str(corpus)], output, settings, progress=False)
    metadata = NgramFilter.open(output).metadata
    prefix = metadata.get("prefix")
    return (
        metadata["bits_xxh3"],
        prefix["bits_xxh3"] if prefix else None,
        metadata["num_ngrams"],
        metadata["num_bits"],
    )


@pytest.mark.parametrize("key", sorted(PINNED))
def test_filter_bits_are_pinned(tmp_path: Path, tokenizer_dir: Path, key: Any) -> None:
    unit, fmt, min_count = key
    for workers in (1, 2):
        assert (
            _build(tmp_path / str(workers), tokenizer_dir, unit, fmt, min_count, workers)
            == PINNED[key]
        )


# (unit, min_count) -> (section_table_xxh3, num_ngrams): the prefix-keyed index, recorded when
# the layout was added (issue 26; re-pinned when blocks got their own checksums, and the word
# index added, in the same issue; re-pinned in issue 34 when the remainder was sized for natural
# queries); the table holds each section's checksum. Workers and
# partitions never change a byte of the file.
PINNED_INDEX: dict[tuple[str, int], tuple[str, int]] = {
    ("token", 1): ("9cbd001b65e62ab2", 522),
    ("token", 2): ("d5352aa118c55c25", 462),
    ("word", 1): ("9c17aa46fe8d0f5f", 2152),
    ("word", 2): ("0b73f0b3c22c6889", 914),
}


@pytest.mark.parametrize(("unit", "min_count"), sorted(PINNED_INDEX))
def test_index_bytes_are_pinned(
    tmp_path: Path, tokenizer_dir: Path, unit: str, min_count: int
) -> None:
    import xxhash

    corpus = _corpus(tmp_path / "corpus")
    files = set()
    for workers, partitions in ((1, 16), (2, 2), (2, 64)):
        output = tmp_path / f"index-{workers}-{partitions}.memfree"
        settings = BuildSettings(
            ngram_size=4,
            unit=unit,
            tokenizer=str(tokenizer_dir) if unit == "token" else None,
            min_count=min_count,
            layout="prefix-index",
            workers=workers,
            num_partitions=partitions,
            shard_bytes=3000,
        )
        build_filter([str(corpus)], output, settings, progress=False)
        metadata = NgramFilter.open(output).metadata
        found = (metadata["section_table_xxh3"], metadata["num_ngrams"])
        assert found == PINNED_INDEX[unit, min_count], (workers, partitions)
        files.add(xxhash.xxh3_64_hexdigest(output.read_bytes()))
    assert len(files) == 1
