"""Building the prefix-keyed index: exact against a reference count, the same bytes whatever the
workers and partitions, sections written by their own tasks, and bad settings refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from memfree.errors import SettingError
from memfree.filterfile import open_filter
from memfree.filterfile.index.reader import IndexFilter
from tests.bloom_builder.test_build import reference_counts, settings_for, write_corpus


@pytest.mark.parametrize("min_count", [1, 3])
def test_the_index_holds_exactly_the_counted_ngrams(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any, min_count: int
) -> None:
    texts = write_corpus(tmp_path / "corpus", 12)
    summary = build_filter(
        [str(tmp_path / "corpus")],
        tmp_path / "f.memfree",
        settings_for(
            tokenizer_dir, min_count=min_count, layout="prefix-index", false_positive_rate=1e-9
        ),
        progress=False,
    )
    counts = reference_counts(tokenizer, texts, 4)
    kept = [ngram for ngram, count in counts.items() if count >= min_count]
    dropped = [ngram for ngram, count in counts.items() if count < min_count]
    assert summary.kept_ngrams == len(kept) and summary.layout == "prefix-index"
    filt = open_filter(tmp_path / "f.memfree")
    assert isinstance(filt, IndexFilter) and len(filt) == len(kept)
    assert filt.contains(np.array(kept)).all()  # no false negatives
    if dropped:
        assert not filt.contains(np.array(dropped)).any()  # 1e-9: nothing else
    # Each stored prefix reports exactly its stored next tokens.
    prefixes = sorted({ngram[:-1] for ngram in kept})
    rows, tokens = filt.next_tokens(np.array(prefixes))
    pairs = zip(rows.tolist(), tokens.tolist(), strict=True)
    reported = {(prefixes[row], token) for row, token in pairs}
    assert reported == {(ngram[:-1], ngram[-1]) for ngram in kept}
    metadata = filt.metadata
    assert metadata["min_count"] == min_count and metadata["vocab_size"] == len(tokenizer)
    assert not (tmp_path / "f.memfree.work").exists()


def test_workers_and_partitions_give_the_same_bytes(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 10)
    outputs = set()
    for workers, partitions in ((1, 1), (2, 4), (2, 4096)):
        output = tmp_path / f"{workers}-{partitions}.memfree"
        settings = settings_for(
            tokenizer_dir, layout="prefix-index", workers=workers, num_partitions=partitions
        )
        build_filter([str(tmp_path / "corpus")], output, settings, progress=False)
        outputs.add(output.read_bytes())
    assert len(outputs) == 1


def test_a_larger_index_has_many_sections(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 40, words_per_file=3000)
    output = tmp_path / "f.memfree"
    settings = settings_for(tokenizer_dir, layout="prefix-index", ngram_size=6, num_partitions=8)
    build_filter([str(tmp_path / "corpus")], output, settings, progress=False)
    filt = open_filter(output)
    assert isinstance(filt, IndexFilter)
    assert filt.metadata["sections"] > 8  # each partition wrote a run of sections


def test_settings_refuse_the_index_where_it_cannot_go(tokenizer_dir: Path) -> None:
    with pytest.raises(SettingError, match="memfree format only"):
        BuildSettings(layout="prefix-index", output_format="pybloomfiltermmap3")
    with pytest.raises(SettingError, match="layout must be one of"):
        BuildSettings(layout="bloom")  # type: ignore[arg-type]
    assert BuildSettings().target_rate == 1e-5 and BuildSettings().uses_index
    assert BuildSettings(layout="blocked-512").target_rate == 1e-3
    assert BuildSettings(unit="word").resolved_layout == "prefix-index"
    assert BuildSettings(output_format="pybloomfiltermmap3").resolved_layout == "blocked-512"


def test_ids_beyond_the_vocabulary_are_skipped_not_truncated(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    # 100_000 does not fit the index's 9-bit token field: its document is skipped and reported
    # (stored truncated, it would ban another token and miss its own).
    corpus = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"ids": [[5, 6, 7, 8, 9], [1, 2, 3, 4, 100_000]]}), corpus)
    settings = settings_for(tokenizer_dir, layout="prefix-index", ids_field="ids")
    summary = build_filter([str(corpus)], tmp_path / "f.memfree", settings, progress=False)
    assert sum(summary.skipped["counts"].values()) == 1
    filt = open_filter(tmp_path / "f.memfree")
    assert filt.contains([[5, 6, 7, 8], [6, 7, 8, 9]]).all() and len(filt) == 2
